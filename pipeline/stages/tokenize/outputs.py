"""The readers of ``make tokenize``'s outputs, one per output, for every stage downstream of it.

:func:`read_ingested_rows` reads the ingested rows behind the ids (checked to be the same ingestion). The tokenizer
itself (vocabulary and settings) is read by ``pipeline.text.text_tokenizer.load_text_tokenizer``, which
also reads a preset's; the label names by ``pipeline.text.conventions.load_labels``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.catalog import ids_file, labels_file, token_counts_file
from pipeline.core.errors import InputError
from pipeline.core.files import manifest_hash, require_manifest
from pipeline.stages.ingest.outputs import read_split
from pipeline.text.conventions import load_labels


def load_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, labels) of one tokenized split, memory-mapped."""
    return (np.load(directory / ids_file(split), mmap_mode="r"), np.load(directory / labels_file(split), mmap_mode="r"))


@dataclass(frozen=True)
class IngestedRows:
    """The ingested splits the tokenize stage's ids were made from: row ``i`` of a split's ids is row ``i`` of its
    frame, so the lexical models (which read the text) and the Transformers (which read the ids) see the same rows."""

    train: pd.DataFrame
    val: pd.DataFrame
    test: pd.DataFrame
    labels: list[str]  # the label names, in class-index order
    ingest_manifest_sha256: str  # the ingestion both stages' outputs come from
    test_token_counts: np.ndarray | None  # the test reviews' untruncated token counts, when tokenize wrote them


def read_ingested_rows(ingest_dir: Path, tokenize_dir: Path) -> IngestedRows:
    """The ingested splits behind ``tokenize_dir``'s ids; an error naming both stages when the ingest folder has
    changed since tokenization (a model would be trained, or fused with one trained, on other splits)."""
    ingest_sha256 = manifest_hash(ingest_dir)
    tokenized_from = require_manifest(tokenize_dir)["inputs"]["ingest_manifest_sha256"]
    if tokenized_from != ingest_sha256:
        raise InputError(
            f"{tokenize_dir}/ was tokenized from another ingestion ({tokenized_from[:12]}) than "
            f"{ingest_dir}/ ({ingest_sha256[:12]}): the Transformers and the lexical "
            "models would be trained on different splits; rerun `make tokenize`"
        )
    counts = tokenize_dir / token_counts_file("test")
    train, val, test = (read_split(ingest_dir, split) for split in ("train", "val", "test"))
    return IngestedRows(
        train,
        val,
        test,
        labels=load_labels(ingest_dir),
        ingest_manifest_sha256=ingest_sha256,
        test_token_counts=np.load(counts) if counts.is_file() else None,
    )
