"""The classifier's ``tf.data`` input: length-bucketed batches of token ids (``pipeline.runtime.batching``).

Used by training (``pipeline.stages.train.fit_and_log``), the tuning study and the benchmarks; nothing here reads a file.
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from pipeline.runtime.batching import (
    TRAINING_LENGTH_MULTIPLE,
    batch_width,
    bucketed_batches,
    padding_fraction,
    worker_share,
)
from pipeline.runtime.hardware import already_sharded
from pipeline.text.conventions import PAD_ID


def subsample(rows: int, size: int, seed: int) -> np.ndarray:
    """``size`` of ``rows`` row positions drawn at random (seeded), in their original order.

    Not the first ``size`` rows: a split may be ordered by label (IMDB's train split is), and its
    head would then hold one class only.
    """
    if size >= rows:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, size, replace=False))


def make_dataset(ids: np.ndarray, labels: np.ndarray, batch_size: int, shuffle_seed: int | None = None,
                 length_multiple: int = TRAINING_LENGTH_MULTIPLE, shard: tuple[int, int] = (0, 1)) -> tf.data.Dataset:
    """Length-bucketed ``(ids, class index)`` batches, each trimmed to its own width (``pipeline.runtime.batching``).

    With ``shuffle_seed`` every epoch draws a new order (seed, seed + 1, ...); without, rows are
    sorted by length. Widths are multiples of ``length_multiple``, so a compiled step sees a
    small fixed set of shapes. ``shard=(index, count)``: every worker of a cluster draws the same
    global batches and keeps its ``index``-th share of each (rows ``index::count``), so all workers
    run the same number of steps and together see each example once per epoch.
    """
    index, count = shard
    ids, labels = np.asarray(ids), np.asarray(labels)
    labels = labels.astype(np.float32 if labels.ndim == 2 else np.int32)  # soft targets, or class indices
    lengths = (ids != PAD_ID).sum(axis=1)
    epochs = itertools.count()

    def batches():
        seed = None if shuffle_seed is None else shuffle_seed + next(epochs)
        for rows in bucketed_batches(lengths, batch_size, seed):
            rows = worker_share(rows, index, count)
            width = batch_width(lengths[rows].max(), length_multiple, ids.shape[1])
            yield ids[rows, :width], labels[rows]

    dataset = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((None, None), tf.int32),
        tf.TensorSpec((None, labels.shape[1]), tf.float32) if labels.ndim == 2 else tf.TensorSpec((None,), tf.int32)))
    if count > 1:
        dataset = already_sharded(dataset)
    return dataset.apply(tf.data.experimental.assert_cardinality(-(-len(ids) // batch_size))).prefetch(2)


def padding_fractions(ids: np.ndarray, batch_size: int, seed: int, length_multiple: int) -> dict[str, float]:
    """Padded share of computed positions: every batch at full width vs length-bucketed."""
    lengths = (np.asarray(ids) != PAD_ID).sum(axis=1)
    width = int(np.asarray(ids).shape[1])
    return {"padding_fraction_full_width": padding_fraction(lengths, [np.arange(len(lengths))], width, width),
            "padding_fraction": padding_fraction(lengths, bucketed_batches(lengths, batch_size, seed),
                                                 length_multiple, width)}
