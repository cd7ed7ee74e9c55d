"""The readers of ``make pseudo-label``'s outputs (``pseudo_labels.parquet``, ``training_crops.parquet``), for the
train stage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.catalog import (
    PSEUDO_CROPS_FILE,
    PSEUDO_LABELS_FILE,
    UNLABELED_IDS_FILE,
    teacher_probability_column,
)
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import require_manifest


def load_pseudo_labels(
    directory: Path, tokenize_dir: Path, num_classes: int, soft: bool
) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(token ids, labels, manifest)`` of the pseudo-labelled reviews in the stage's output ``directory``, for the
    training stage.

    Labels are class indices, or with ``soft`` (``pseudo_label.soft``) the teacher's ``[N, k]`` probabilities.
    Refuses labels made from another ingestion than the tokenized one, or for other classes.
    """
    manifest = require_manifest(directory)
    tokenized_from = require_manifest(tokenize_dir)["inputs"]["ingest_manifest_sha256"]
    if manifest["inputs"]["ingest_manifest_sha256"] != tokenized_from:
        raise InputError(
            f"{directory}/: the pseudo labels were made from another ingestion than {tokenize_dir}/; "
            "rerun `make pseudo-label`"
        )
    unlabeled_path = tokenize_dir / UNLABELED_IDS_FILE
    if not unlabeled_path.is_file():
        raise MissingInputError(f"no {unlabeled_path}: rerun `make tokenize` after ingesting the unlabeled reviews")
    frame = pd.read_parquet(directory / PSEUDO_LABELS_FILE)
    if frame.empty:
        raise InputError(
            f"{directory / PSEUDO_LABELS_FILE}: no pseudo labels (none reached pseudo_label.min_confidence "
            f"{manifest['config']['pseudo_label']['min_confidence']}); lower it or turn "
            "training.pseudo_labels off"
        )
    ids = np.load(unlabeled_path, mmap_mode="r")
    labels = frame["label"].to_numpy(np.int32)
    if frame["row"].max() >= len(ids) or labels.max() >= num_classes:
        raise InputError(
            f"{directory / PSEUDO_LABELS_FILE}: rows or labels out of range for {unlabeled_path} "
            f"({len(ids)} reviews, {num_classes} classes); rerun `make pseudo-label`"
        )
    if soft:
        columns = [teacher_probability_column(c) for c in range(num_classes)]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise InputError(
                f"{directory / PSEUDO_LABELS_FILE}: no teacher probabilities {missing} for "
                "pseudo_label.soft; rerun `make pseudo-label FORCE=1`"
            )
        labels = frame[columns].to_numpy(np.float32)
    return np.asarray(ids[frame["row"].to_numpy()]), labels, manifest


def training_crops_path(directory: Path) -> Path:
    """The stage's sentence crops of train reviews (``pseudo_label.crops_per_review``); refuses an output made
    without them."""
    path = directory / PSEUDO_CROPS_FILE
    if not path.is_file():
        raise MissingInputError(
            f"no {path}: the pseudo labels were made without pseudo_label.crops_per_review; rerun `make pseudo-label`"
        )
    return path


def load_training_crops(directory: Path, num_classes: int) -> tuple[list[str], np.ndarray]:
    """``(texts, [N, k] soft targets)`` of the sentence crops of train reviews the stage wrote (all of them:
    distillation never runs on ``training.max_train_samples`` rows)."""
    frame = pd.read_parquet(training_crops_path(directory))
    columns = [teacher_probability_column(c) for c in range(num_classes)]
    return frame["text"].tolist(), frame[columns].to_numpy(np.float32)
