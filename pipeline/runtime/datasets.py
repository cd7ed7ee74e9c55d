"""The classifier's input: length-bucketed batches of token ids (``pipeline.runtime.batching``), as a ``tf.data``
pipeline on TensorFlow and as a ``keras.utils.PyDataset`` of NumPy batches on any other Keras backend, which
compiles every input shape: there batches take a few fixed widths (``xla_widths``).

Used by training (``pipeline.stages.train.fit_and_log``), the tuning study and the benchmarks; nothing here reads a
file.
"""

from __future__ import annotations

import itertools

import keras
import numpy as np

from pipeline.runtime.backend import uses_tensorflow
from pipeline.runtime.batching import (
    TRAINING_LENGTH_MULTIPLE,
    batch_width,
    bucketed_batches,
    fixed_width,
    padding_fraction,
    worker_share,
    xla_widths,
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


def make_dataset(
    ids: np.ndarray,
    labels: np.ndarray,
    batch_size: int,
    shuffle_seed: int | None = None,
    length_multiple: int = TRAINING_LENGTH_MULTIPLE,
    shard: tuple[int, int] = (0, 1),
):
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
    if not uses_tensorflow():
        if count > 1:
            raise ValueError("sharded input is TensorFlow's multi-worker training only")
        return BucketedBatches(ids, labels, batch_size, shuffle_seed, xla_widths(ids.shape[1], length_multiple))
    import tensorflow as tf

    lengths = (ids != PAD_ID).sum(axis=1)
    epochs = itertools.count()

    def batches():
        seed = None if shuffle_seed is None else shuffle_seed + next(epochs)
        for rows in bucketed_batches(lengths, batch_size, seed):
            rows = worker_share(rows, index, count)
            width = batch_width(lengths[rows].max(), length_multiple, ids.shape[1])
            yield ids[rows, :width], labels[rows]

    dataset = tf.data.Dataset.from_generator(
        batches,
        output_signature=(
            tf.TensorSpec((None, None), tf.int32),
            tf.TensorSpec((None, labels.shape[1]), tf.float32)
            if labels.ndim == 2
            else tf.TensorSpec((None,), tf.int32),
        ),
    )
    if count > 1:
        dataset = already_sharded(dataset)
    return dataset.apply(tf.data.experimental.assert_cardinality(-(-len(ids) // batch_size))).prefetch(2)


def padding_fractions(ids: np.ndarray, batch_size: int, seed: int, length_multiple: int) -> dict[str, float]:
    """Padded share of computed positions: every batch at full width vs length-bucketed."""
    lengths = (np.asarray(ids) != PAD_ID).sum(axis=1)
    width = int(np.asarray(ids).shape[1])
    return {
        "padding_fraction_full_width": padding_fraction(lengths, [np.arange(len(lengths))], width, width),
        "padding_fraction": padding_fraction(
            lengths, bucketed_batches(lengths, batch_size, seed), length_multiple, width
        ),
    }


class BucketedBatches(keras.utils.PyDataset):
    """``make_dataset``'s batches for a backend other than TensorFlow: the same length-bucketed rows, in NumPy,
    each batch trimmed to the narrowest of ``widths`` that holds it; with ``shuffle_seed`` a new order every epoch
    (seed, seed + 1, ...), as the ``tf.data`` pipeline draws."""

    def __init__(
        self, ids: np.ndarray, labels: np.ndarray, batch_size: int, shuffle_seed: int | None, widths: tuple[int, ...]
    ):
        super().__init__()
        self.ids, self.labels, self.batch_size = ids, labels, batch_size
        self.shuffle_seed, self.widths, self.epoch = shuffle_seed, widths, 0
        self.lengths = (ids != PAD_ID).sum(axis=1)
        self.batches = self._draw()

    def _draw(self) -> list[np.ndarray]:
        seed = None if self.shuffle_seed is None else self.shuffle_seed + self.epoch
        return bucketed_batches(self.lengths, self.batch_size, seed)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int):
        rows = self.batches[index]
        width = fixed_width(int(self.lengths[rows].max()), self.widths)
        return self.ids[rows, :width], self.labels[rows]

    def on_epoch_end(self) -> None:
        self.epoch += 1
        self.batches = self._draw()
