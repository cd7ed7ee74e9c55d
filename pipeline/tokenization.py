"""Tokenization stage: a WordPiece vocabulary learned on train, and fixed-length token ids.

Reads:  ``data/ingest/{train,val,test}.parquet``, ``unlabeled.parquet`` when ingestion wrote one, and
        the manifest. The vocabulary is learned on train plus (``tokenizer.include_unlabeled``) the
        unlabeled reviews, never on validation or test texts.
Writes: ``data/tokenize/vocabulary.txt``, ``tokenizer.json`` (encoding settings and the
        vocabulary checksum), ``{split}_ids.npy`` (int32, ``[rows, max_sequence_length]``; also
        ``unlabeled_ids.npy``),
        ``{split}_labels.npy`` (class indices), ``{split}_token_counts.npy`` (tokens before
        truncation), ``labels.json`` (class names, copied from ingest), ``token_lengths.png``
        and ``manifest.json``.

:class:`TextEncoder` is the one path from raw text to model input; training, evaluation,
scoring and the MLflow pyfunc model all use it with the saved vocabulary.
"""

from __future__ import annotations

import collections
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from pipeline.artifacts import (
    atomic_write_json,
    build_manifest,
    is_up_to_date,
    manifest_hash,
    sha256_file,
    sha256_text,
    staged_directory,
    write_manifest,
)
from pipeline.config import Config, TokenizerConfig
from pipeline.errors import InputError, MissingInputError
from pipeline.stages import require_output, stage_dir
from pipeline.text import (
    CLS_ID,
    LABELS_FILE,
    MASK_ID,
    PAD_ID,
    REQUIRED_RESERVED,
    RESERVED_TOKENS,
    UNK_ID,
    UNLABELED_FILE,
    clean_text,
    percentiles,
)

STAGE = "tokenize"
SPLITS = ("train", "val", "test")
UNLABELED = "unlabeled"      # token ids only (unlabeled_ids.npy), for pretraining
VOCABULARY_FILE = "vocabulary.txt"
SETTINGS_FILE = "tokenizer.json"
SETTINGS_FORMAT = "pipeline-wordpiece v1"
_ENCODE_BATCH = 2048


# --------------------------------------------------------------------------- pure functions


def truncate_and_pad_rows(flat_ids: np.ndarray, row_splits: np.ndarray, max_sequence_length: int,
                          truncation: str, head_tokens: int) -> np.ndarray:
    """Many token rows at once (given as ragged ``flat_ids`` + ``row_splits``) -> ``[N, max_sequence_length]``.

    Each row becomes ``[CLS]`` + the kept tokens + ``[PAD]``s. ``head`` keeps the first tokens,
    ``tail`` the last, ``head_tail`` the first ``head_tokens`` and the last
    ``max_sequence_length - 1 - head_tokens``. Vectorised: no Python loop over rows.
    """
    if truncation not in ("head", "tail", "head_tail"):
        raise ValueError(f"unknown truncation strategy {truncation!r}")
    flat_ids, row_splits = np.asarray(flat_ids), np.asarray(row_splits, dtype=np.int64)
    starts, lengths = row_splits[:-1, None], np.diff(row_splits)[:, None]
    budget = max_sequence_length - 1
    kept = np.minimum(lengths, budget)
    columns = np.arange(budget)[None, :]
    if truncation == "head":
        source = columns
    elif truncation == "tail":
        source = lengths - kept + columns
    else:  # beyond the budget: the first head_tokens, then the row's last tokens
        source = np.where((lengths > budget) & (columns >= head_tokens), lengths - budget + columns, columns)
    ids = np.full((len(lengths), max_sequence_length), PAD_ID, dtype=np.int32)
    ids[:, 0] = CLS_ID
    valid = columns < kept
    ids[:, 1:][valid] = flat_ids[(starts + source)[valid]]
    return ids


def truncate_and_pad(token_ids: Sequence[int], max_sequence_length: int, truncation: str,
                     head_tokens: int) -> np.ndarray:
    """One row of :func:`truncate_and_pad_rows`."""
    token_ids = np.asarray(token_ids, dtype=np.int32)
    return truncate_and_pad_rows(token_ids, np.array([0, len(token_ids)]), max_sequence_length, truncation,
                                 head_tokens)[0]


@dataclass(frozen=True)
class EncoderSettings:
    """Everything besides the vocabulary that decides how text becomes ids."""

    lowercase: bool
    max_sequence_length: int
    truncation: str
    head_tokens: int

    @classmethod
    def from_config(cls, config: TokenizerConfig) -> "EncoderSettings":
        return cls(config.lowercase, config.max_sequence_length, config.truncation, config.head_tokens)


class TextEncoder:
    """Raw review text -> ``[CLS]``-prefixed, padded WordPiece ids, with a saved vocabulary."""

    def __init__(self, vocabulary: Sequence[str], settings: EncoderSettings):
        import keras_hub  # imported here so that reading settings does not load TensorFlow

        if tuple(vocabulary[:REQUIRED_RESERVED]) != RESERVED_TOKENS[:REQUIRED_RESERVED]:
            raise InputError(f"vocabulary must start with {RESERVED_TOKENS}, got {tuple(vocabulary[:REQUIRED_RESERVED])}")
        self.vocabulary = list(vocabulary)
        self.settings = settings
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary, lowercase=settings.lowercase, oov_token="[UNK]", dtype="int32"
        )
        self._tokenize = None  # the tokenizer as one traced graph, built on first use

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    @property
    def can_mask(self) -> bool:
        """Whether the vocabulary has ``[MASK]`` at its reserved id (needed for pretraining)."""
        return len(self.vocabulary) > MASK_ID and self.vocabulary[MASK_ID] == RESERVED_TOKENS[MASK_ID]

    def _ragged_batches(self, texts: Sequence[str]):
        """(flat ids, row splits) of the untruncated WordPiece ids, one batch of texts at a time.

        The tokenizer runs as one ``tf.function`` traced once per encoder (any batch size): a
        ``tf.data`` map would trace it again on every call, about 0.25 s each, which cost a chunked
        reader (``make score``) more than the tokenization itself; measured on the 25,000 test
        reviews this is also faster in one call (2.1 s against 2.9 s, `make bench`'s machine).
        """
        import tensorflow as tf

        if self._tokenize is None:
            self._tokenize = tf.function(self.tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])
        texts = texts if isinstance(texts, list) else list(texts)
        for start in range(0, len(texts), _ENCODE_BATCH):
            batch = [clean_text(text) for text in texts[start:start + _ENCODE_BATCH]]
            ragged = self._tokenize(tf.constant(batch, dtype=tf.string))
            yield ragged.flat_values.numpy(), ragged.row_splits.numpy()

    def encode_with_counts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """(ids ``[N, max_sequence_length]``, untruncated token counts, number of ``[UNK]`` tokens)."""
        s = self.settings
        ids, counts, unknown = [], [], 0
        for flat, splits in self._ragged_batches(texts):
            ids.append(truncate_and_pad_rows(flat, splits, s.max_sequence_length, s.truncation, s.head_tokens))
            counts.append(np.diff(splits).astype(np.int32))
            unknown += int((flat == UNK_ID).sum())
        if not ids:
            return np.zeros((0, s.max_sequence_length), np.int32), np.zeros(0, np.int32), 0
        return np.concatenate(ids), np.concatenate(counts), unknown

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """The model input for ``texts``: int32 ``[N, max_sequence_length]``."""
        return self.encode_with_counts(texts)[0]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids back to text, dropping ``[CLS]`` and ``[PAD]`` and joining ``##`` word pieces."""
        pieces = [self.vocabulary[i] for i in ids if i not in (PAD_ID, CLS_ID)]
        text = " ".join(pieces)
        return text.replace(" ##", "")

    def save(self, directory: Path) -> None:
        vocabulary_text = "".join(token + "\n" for token in self.vocabulary)
        (directory / VOCABULARY_FILE).write_text(vocabulary_text, encoding="utf-8")
        payload = {"format": SETTINGS_FORMAT, **asdict(self.settings),
                   "vocabulary_size": self.vocabulary_size,
                   "vocabulary_sha256": sha256_text(vocabulary_text)}
        atomic_write_json(directory / SETTINGS_FILE, payload)

    @classmethod
    def load(cls, directory: str | Path) -> "TextEncoder":
        """Load a saved encoder; a vocabulary edited or truncated since saving is an error."""
        directory = Path(directory)
        settings_path, vocabulary_path = directory / SETTINGS_FILE, directory / VOCABULARY_FILE
        for path in (settings_path, vocabulary_path):
            if not path.is_file():
                raise MissingInputError(f"tokenizer file missing: {path} (run `make tokenize` first)")
        payload = json.loads(settings_path.read_text())
        if payload.get("format") != SETTINGS_FORMAT:
            raise InputError(f"{settings_path}: format {payload.get('format')!r}, expected {SETTINGS_FORMAT!r}")
        vocabulary_text = vocabulary_path.read_text(encoding="utf-8")
        actual = sha256_text(vocabulary_text)
        if actual != payload["vocabulary_sha256"]:
            raise InputError(
                f"{vocabulary_path} does not match {settings_path}: sha256 {actual}, expected "
                f"{payload['vocabulary_sha256']} (edited or truncated? rerun `make tokenize FORCE=1`)"
            )
        vocabulary = vocabulary_text.split("\n")[:-1]
        if len(vocabulary) != payload["vocabulary_size"]:
            raise InputError(f"{vocabulary_path}: {len(vocabulary)} tokens, expected {payload['vocabulary_size']}")
        settings = EncoderSettings(**{k: payload[k] for k in EncoderSettings.__dataclass_fields__})
        return cls(vocabulary, settings)


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
            dataset, config.vocabulary_size, lowercase=config.lowercase,
            reserved_tokens=list(RESERVED_TOKENS),
        )
    else:
        from keras_hub.src.tokenizers.word_piece_tokenizer import pretokenize
        from keras_hub.src.tokenizers.word_piece_tokenizer_trainer import learner

        words = dataset.map(lambda batch: pretokenize(batch, config.lowercase, False, True, True),
                            num_parallel_calls=tf.data.AUTOTUNE)
        counts = learner.count_words(words)
        frequent = collections.Counter({w: c for w, c in counts.items() if c >= config.min_frequency})
        if not frequent:
            raise InputError(f"no word occurs at least tokenizer.min_frequency={config.min_frequency} times")
        vocabulary = learner.learn(frequent, vocab_size=config.vocabulary_size,
                                   reserved_tokens=list(RESERVED_TOKENS), include_joiner_token=True, joiner="##")
    return list(vocabulary[: config.vocabulary_size])


def plot_token_lengths(counts: dict[str, np.ndarray], cutoff: int, path: Path) -> None:
    from pipeline.plots import new_figure, save_figure

    figure, axis = new_figure()
    upper = int(max(np.percentile(c, 99.5) for c in counts.values())) + 1
    bins = np.linspace(0, max(upper, cutoff + 1), 60)
    for name, values in counts.items():
        axis.hist(np.minimum(values, bins[-1]), bins=bins, histtype="step", density=True, label=name)
    axis.axvline(cutoff, color="black", linestyle="--", label=f"cut-off ({cutoff} tokens + [CLS])")
    axis.set(xlabel="WordPiece tokens per review (before truncation)", ylabel="density",
             title="Token lengths")
    axis.legend()
    save_figure(figure, path)


# --------------------------------------------------------------------------- stage entry point


def load_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, labels) of one tokenized split, memory-mapped."""
    return (np.load(directory / f"{split}_ids.npy", mmap_mode="r"),
            np.load(directory / f"{split}_labels.npy", mmap_mode="r"))


def run(config: Config, force: bool = False) -> Path:
    """Learn the vocabulary on train (+ unlabeled), encode every split and return ``data/tokenize``."""
    started = time.perf_counter()
    ingest_dir = require_output(config, "ingest")
    out_dir = stage_dir(config, STAGE)
    inputs = {"ingest_manifest_sha256": manifest_hash(ingest_dir), "reserved_tokens": ",".join(RESERVED_TOKENS)}
    config_hash = config.section_hash("tokenizer")
    outputs = [VOCABULARY_FILE, SETTINGS_FILE, LABELS_FILE] + [f"{s}_{k}.npy" for s in SPLITS for k in ("ids", "labels")]
    if not force and is_up_to_date(out_dir, config_hash, inputs, outputs):
        print(f"tokenize: up to date, nothing to do ({out_dir}/ with config {config_hash})")
        return out_dir

    frames = {split: pd.read_parquet(ingest_dir / f"{split}.parquet") for split in SPLITS}
    unlabeled_path = ingest_dir / UNLABELED_FILE
    if unlabeled_path.is_file():  # for pretraining; never validation or test texts
        frames[UNLABELED] = pd.read_parquet(unlabeled_path)
    corpus = list(frames["train"]["text"])
    if config.tokenizer.include_unlabeled and UNLABELED in frames:
        corpus += list(frames[UNLABELED]["text"])
    print(f"tokenize: learning a {config.tokenizer.vocabulary_size:,}-token WordPiece vocabulary "
          f"from {len(corpus):,} texts ...", flush=True)
    learn_started = time.perf_counter()
    encoder = TextEncoder(learn_vocabulary(corpus, config.tokenizer), EncoderSettings.from_config(config.tokenizer))
    learn_seconds = time.perf_counter() - learn_started

    stats: dict[str, dict] = {"unknown_token_rate": {}, "truncated_fraction": {}, "token_length": {}}
    counts_by_split = {}
    with staged_directory(out_dir) as staging:
        encoder.save(staging)
        shutil.copy2(ingest_dir / LABELS_FILE, staging / LABELS_FILE)
        for split in frames:
            ids, counts, unknown = encoder.encode_with_counts(list(frames[split]["text"]))
            np.save(staging / f"{split}_ids.npy", ids)
            if split != UNLABELED:
                np.save(staging / f"{split}_labels.npy", frames[split]["label"].to_numpy(np.int32))
            np.save(staging / f"{split}_token_counts.npy", counts)
            counts_by_split[split] = counts
            stats["unknown_token_rate"][split] = round(unknown / max(int(counts.sum()), 1), 6)
            stats["truncated_fraction"][split] = round(float((counts > config.tokenizer.max_sequence_length - 1).mean()), 6)
            stats["token_length"][split] = percentiles(counts)
        plot_token_lengths(counts_by_split, config.tokenizer.max_sequence_length - 1, staging / "token_lengths.png")
        manifest = build_manifest(
            STAGE, config_hash, inputs, config.to_dict()["tokenizer"],
            vocabulary_size=encoder.vocabulary_size,
            vocabulary_sha256=sha256_file(staging / VOCABULARY_FILE),
            rows={split: len(frame) for split, frame in frames.items()},
            corpus_texts=len(corpus),
            learn_seconds=round(learn_seconds, 1),
            **stats,
        )
        write_manifest(staging, manifest)
    rates = ", ".join(f"{s} {stats['unknown_token_rate'][s]:.2%} unk / {stats['truncated_fraction'][s]:.1%} truncated"
                      for s in frames)
    print(f"tokenize: read {sum(len(f) for f in frames.values()):,} reviews from {ingest_dir}/; wrote "
          f"{encoder.vocabulary_size:,}-token vocabulary and ids to {out_dir}/ ({rates}) "
          f"in {time.perf_counter() - started:.1f}s")
    return out_dir


def main(config: Config, args) -> None:
    run(config, force=args.force)
