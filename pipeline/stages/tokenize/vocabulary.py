"""The work of ``make tokenize``: a WordPiece vocabulary learned on train, and fixed-length token ids for every split.

Reads:  ``data/ingest/{train,val,test}.parquet``, ``unlabeled.parquet`` when ingestion wrote one, and
        the manifest. The vocabulary is learned on train plus (``tokenizer.include_unlabeled``) the
        unlabeled reviews, never on validation or test texts.
Writes: ``data/tokenize/vocabulary.txt``, ``tokenizer.json`` (``pipeline.text.wordpiece``), ``{split}_ids.npy``
        (int32, ``[rows, max_sequence_length]``; also ``unlabeled_ids.npy``), ``{split}_labels.npy``
        (class indices), ``{split}_token_counts.npy`` (tokens before truncation), ``labels.json`` (class
        names, copied from ingest), ``token_lengths.png`` and ``manifest.json``.
"""

from __future__ import annotations

import collections
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import Config, TokenizerConfig
from pipeline.core.catalog import (
    LABELS_FILE,
    SPLITS,
    TOKEN_LENGTHS_PLOT,
    TOKENIZER_SETTINGS_FILE,
    UNLABELED,
    VOCABULARY_FILE,
    ids_file,
    labels_file,
    require_output,
    stage_dir,
    token_counts_file,
)
from pipeline.core.errors import InputError
from pipeline.core.files import (
    build_manifest,
    is_up_to_date,
    manifest_hash,
    sha256_file,
    staged_directory,
    write_manifest,
)
from pipeline.model.preset_classifier import load_preset_backbone
from pipeline.stages.ingest.outputs import read_split, read_unlabeled
from pipeline.text.conventions import RESERVED_TOKENS, percentiles
from pipeline.text.preset_tokenizer import preset_text_tokenizer
from pipeline.text.text_tokenizer import TextTokenizer
from pipeline.text.wordpiece import TokenizationSettings, WordPieceTextTokenizer

STAGE = "tokenize"


def learn_vocabulary(texts: Sequence[str], config: TokenizerConfig) -> list[str]:
    """Learn a WordPiece vocabulary with KerasHub from ``texts`` (train texts only).

    With ``min_frequency`` 1 this is ``keras_hub.tokenizers.compute_word_piece_vocabulary``.
    Above 1, words rarer than ``min_frequency`` are dropped from the word counts before the
    same KerasHub learner runs; the learner's time grows with the number of distinct
    words, so on IMDB a minimum of 5 cuts learning from about 105 s to 28 s here.
    """
    import keras_hub
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(list(texts)).batch(1000)
    if config.min_frequency <= 1:
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            dataset,
            config.vocabulary_size,
            lowercase=config.lowercase,
            reserved_tokens=list(RESERVED_TOKENS),
        )
    else:
        from keras_hub.src.tokenizers.word_piece_tokenizer import pretokenize
        from keras_hub.src.tokenizers.word_piece_tokenizer_trainer import learner

        words = dataset.map(
            lambda batch: pretokenize(batch, config.lowercase, False, True, True), num_parallel_calls=tf.data.AUTOTUNE
        )
        counts = learner.count_words(words)
        frequent = collections.Counter({w: c for w, c in counts.items() if c >= config.min_frequency})
        if not frequent:
            raise InputError(f"no word occurs at least tokenizer.min_frequency={config.min_frequency} times")
        vocabulary = learner.learn(
            frequent,
            vocab_size=config.vocabulary_size,
            reserved_tokens=list(RESERVED_TOKENS),
            include_joiner_token=True,
            joiner="##",
        )
    return list(vocabulary[: config.vocabulary_size])


def plot_token_lengths(counts: dict[str, np.ndarray], cutoff: int, path: Path) -> None:
    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure()
    upper = int(max(np.percentile(c, 99.5) for c in counts.values())) + 1
    bins = np.linspace(0, max(upper, cutoff + 1), 60)
    for name, values in counts.items():
        axis.hist(np.minimum(values, bins[-1]), bins=bins, histtype="step", density=True, label=name)
    axis.axvline(cutoff, color="black", linestyle="--", label=f"cut-off ({cutoff} tokens + [CLS])")
    axis.set(xlabel="WordPiece tokens per review (before truncation)", ylabel="density", title="Token lengths")
    axis.legend()
    save_figure(figure, path)


# --------------------------------------------------------------------------- stage entry point


def write_encoded_splits(
    text_tokenizer: TextTokenizer, frames: dict[str, pd.DataFrame], max_tokens: int, staging: Path
) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """Write every split's token ids, labels (not for the unlabeled reviews) and token counts into ``staging``;
    returns the manifest's statistics by split (unknown-token rate, fraction longer than ``max_tokens``, length
    percentiles) and the token counts by split."""
    stats: dict[str, dict] = {"unknown_token_rate": {}, "truncated_fraction": {}, "token_length": {}}
    counts_by_split = {}
    for split in frames:
        ids, counts, unknown = text_tokenizer.encode_with_counts(list(frames[split]["text"]))
        np.save(staging / ids_file(split), ids)
        if split != UNLABELED:
            np.save(staging / labels_file(split), frames[split]["label"].to_numpy(np.int32))
        np.save(staging / token_counts_file(split), counts)
        counts_by_split[split] = counts
        stats["unknown_token_rate"][split] = round(unknown / max(int(counts.sum()), 1), 6)
        stats["truncated_fraction"][split] = round(float((counts > max_tokens).mean()), 6)
        stats["token_length"][split] = percentiles(counts)
    return stats, counts_by_split


def tokenize(config: Config, force: bool = False) -> Path:
    """Learn the vocabulary on train (+ unlabeled), encode every split and return ``data/tokenize``."""
    started = time.perf_counter()
    ingest_dir = require_output(config, "ingest")
    out_dir = stage_dir(config, STAGE)
    inputs = {"ingest_manifest_sha256": manifest_hash(ingest_dir), "reserved_tokens": ",".join(RESERVED_TOKENS)}
    if config.model.preset is not None:  # the preset's own tokenizer and vocabulary
        inputs = {"ingest_manifest_sha256": inputs["ingest_manifest_sha256"], "preset": config.model.preset}
    config_hash = config.section_hash("tokenizer")
    outputs = [VOCABULARY_FILE, TOKENIZER_SETTINGS_FILE, LABELS_FILE] + [
        f(s) for s in SPLITS for f in (ids_file, labels_file)
    ]
    if not force and is_up_to_date(out_dir, config_hash, inputs, outputs):
        print(f"tokenize: up to date, nothing to do ({out_dir}/ with config {config_hash})")
        return out_dir

    settings = TokenizationSettings.from_config(config.tokenizer)
    preset = None
    if config.model.preset is not None:  # checked first; the backbone without weights gives its limits
        backbone = load_preset_backbone(config.model.preset, load_weights=False)
        preset = preset_text_tokenizer(config.model.preset, settings, backbone)
    frames = {split: read_split(ingest_dir, split) for split in SPLITS}
    unlabeled = read_unlabeled(ingest_dir)
    if unlabeled is not None:  # for pretraining; never validation or test texts
        frames[UNLABELED] = unlabeled
    corpus = list(frames["train"]["text"])
    if config.tokenizer.include_unlabeled and UNLABELED in frames:
        corpus += list(frames[UNLABELED]["text"])
    learn_started = time.perf_counter()
    text_tokenizer: TextTokenizer
    if preset is not None:
        print(f"tokenize: the {preset.vocabulary_size:,}-token tokenizer of preset {config.model.preset}", flush=True)
        text_tokenizer, corpus = preset, []
    else:
        print(
            f"tokenize: learning a {config.tokenizer.vocabulary_size:,}-token WordPiece vocabulary "
            f"from {len(corpus):,} texts ...",
            flush=True,
        )
        text_tokenizer = WordPieceTextTokenizer(learn_vocabulary(corpus, config.tokenizer), settings)
    learn_seconds = time.perf_counter() - learn_started

    max_tokens = config.tokenizer.max_sequence_length - 1
    with staged_directory(out_dir) as staging:
        text_tokenizer.save(staging)
        shutil.copy2(ingest_dir / LABELS_FILE, staging / LABELS_FILE)
        stats, counts_by_split = write_encoded_splits(text_tokenizer, frames, max_tokens, staging)
        plot_token_lengths(counts_by_split, max_tokens, staging / TOKEN_LENGTHS_PLOT)
        manifest = build_manifest(
            STAGE,
            config_hash,
            inputs,
            config.to_dict()["tokenizer"],
            vocabulary_size=text_tokenizer.vocabulary_size,
            vocabulary_sha256=sha256_file(staging / VOCABULARY_FILE),
            rows={split: len(frame) for split, frame in frames.items()},
            corpus_texts=len(corpus),
            learn_seconds=round(learn_seconds, 1),
            **stats,
        )
        write_manifest(staging, manifest)
    rates = ", ".join(
        f"{s} {stats['unknown_token_rate'][s]:.2%} unk / {stats['truncated_fraction'][s]:.1%} truncated" for s in frames
    )
    print(
        f"tokenize: read {sum(len(f) for f in frames.values()):,} reviews from {ingest_dir}/; wrote "
        f"{text_tokenizer.vocabulary_size:,}-token vocabulary and ids to {out_dir}/ ({rates}) "
        f"in {time.perf_counter() - started:.1f}s"
    )
    return out_dir


def own_tokenization(config: Config, base: Config) -> Config:
    """``config`` as is when its tokenizer settings are ``base``'s; otherwise ``config`` reading a tokenization of
    its own, ``<base data>/tune/tokenize-<hash>/`` (made once: skipped when up to date), with links to the base's
    ingestion, pseudo labels and pretraining, so that a tune trial or the tuned candidate of a comparison never
    overwrites the ids the base config trains on."""
    if config.section_hash("tokenizer") == base.section_hash("tokenizer"):
        return config
    folder = base.data_dir / "tune" / f"tokenize-{config.section_hash('tokenizer')[:8]}"
    folder.mkdir(parents=True, exist_ok=True)
    for stage in ("ingest", "pseudo-label", "pretrain"):  # what does not depend on the tokenization's ids
        source, link = stage_dir(base, stage), stage_dir(base, stage).name
        if source.is_dir() and not (folder / link).exists():
            try:
                (folder / link).symlink_to(source.resolve(), target_is_directory=True)
            except FileExistsError:  # another process made it first
                pass
    config = config.replace(paths={"data_dir": str(folder)})
    tokenize(config)
    return config
