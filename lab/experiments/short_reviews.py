"""``make short-reviews``: a short-text labelled set built from the ingested reviews, for the learning curve.

Reads:  ``data/ingest/`` (train, val, test).
Writes: ``data/short_reviews/reviews.parquet``: every review of at most ``--max-words`` words (split at whitespace),
        with its label's name and the split it came from (``text``, ``label``, ``split``), in each split's order;
        a table ``make ingest`` reads as ``data.source: table`` with ``data.split_column: split``.

Where pretrained encoders are said to win is short texts and few labels; IMDB's own short reviews are such a set
with real labels, and at 80 words they fit a 128-token encoder whole. The texts stay IMDB's (Large Movie Review
Dataset v1.0, Maas et al., ACL 2011: distributed by its authors for research, asking that the paper be cited; no
licence file ships with it): the set is built on the user's machine from the user's copy and never redistributed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lab.experiments import DEFAULT_MAX_WORDS
from pipeline.config import Config
from pipeline.core.catalog import SHORT_REVIEWS_TABLE, SPLITS, require_output, stage_dir
from pipeline.core.errors import ConfigError, InputError
from pipeline.core.files import atomic_write_parquet
from pipeline.stages.ingest.outputs import read_split
from pipeline.text.conventions import load_labels


def short_reviews(splits: dict[str, pd.DataFrame], names: list[str], max_words: int) -> pd.DataFrame:
    """The reviews of at most ``max_words`` words of every split, as a table with ``text``, ``label`` (the class
    name) and ``split``."""
    if max_words < 1:
        raise ConfigError(f"--max-words must be positive, got {max_words}")
    parts = []
    for split in SPLITS:
        frame = splits[split]
        kept = frame[frame["text"].str.split().str.len() <= max_words]
        parts.append(
            pd.DataFrame(
                {"text": kept["text"].to_numpy(), "split": split, "label": [names[index] for index in kept["label"]]}
            )
        )
    return pd.concat(parts, ignore_index=True)[["text", "label", "split"]]


def run(config: Config, max_words: int = DEFAULT_MAX_WORDS) -> Path:
    ingest_dir = require_output(config, "ingest")
    splits = {split: read_split(ingest_dir, split, columns=["text", "label"]) for split in SPLITS}
    table = short_reviews(splits, load_labels(ingest_dir), max_words)
    counts = table["split"].value_counts()
    if not all(counts.get(split, 0) for split in SPLITS):
        raise InputError(
            f"reviews of at most {max_words} words: {dict(counts)} per split; every split needs some "
            "(raise --max-words)"
        )
    path = atomic_write_parquet(table, stage_dir(config, "short-reviews") / SHORT_REVIEWS_TABLE)
    print(
        f"short-reviews: read {sum(len(frame) for frame in splits.values()):,} reviews from {ingest_dir}/; kept "
        f"those of at most {max_words} words: " + ", ".join(f"{counts[s]:,} {s}" for s in SPLITS) + f"; wrote {path}"
    )
    return path


def main(config: Config, args) -> None:
    run(config, args.max_words)
