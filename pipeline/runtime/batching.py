"""Length-bucketed batches: little padding, every example exactly once per epoch.

Reviews vary from a few dozen to hundreds of tokens, and a batch padded to the longest
review in the split computes mostly padding. Here examples are shuffled, sorted by length
within windows of ``window_batches`` batches, cut into batches and the batches shuffled;
each batch is then trimmed to its longest row rounded up to ``multiple`` tokens. The set of
batch widths is small and fixed (multiples of ``multiple`` up to the maximum length), so a
compiled step sees a handful of shapes and never retraces per batch.

Pure NumPy; the train and pretrain stages and ``pipeline.model.forward`` turn the batches into tensors.
"""

from __future__ import annotations

import numpy as np

# Batch widths are multiples of these. Training (classifier and masked LM) takes 16 by default
# (``training.length_multiple``): less padding, and its eager steps do not care about shapes.
# Scoring compiles one XLA executable per width, so it takes 32: 8 widths for 256 tokens.
TRAINING_LENGTH_MULTIPLE = 16
SCORING_LENGTH_MULTIPLE = 32


def batch_width(longest: int, multiple: int, limit: int) -> int:
    """``longest`` rounded up to a multiple of ``multiple``, at most ``limit`` (and at least 1)."""
    return int(min(limit, max(1, -(-int(longest) // multiple) * multiple)))


def xla_widths(limit: int, multiple: int, count: int = 4) -> tuple[int, ...]:
    """The few batch widths a backend that compiles every input shape (JAX's XLA) is given: ``limit``, its half, its
    quarter, ... (``count`` of them, each a multiple of ``multiple``), so a fit compiles at most ``count`` steps."""
    return tuple(sorted({batch_width(-(-limit // 2**k), multiple, limit) for k in range(count)}))


def fixed_width(longest: int, widths: tuple[int, ...]) -> int:
    """The narrowest of ``widths`` that holds ``longest`` tokens (the widest when none does)."""
    return next((width for width in widths if width >= longest), widths[-1])


def bucketed_batches(
    lengths: np.ndarray, batch_size: int, seed: int | None, window_batches: int = 50
) -> list[np.ndarray]:
    """Row indices of each batch; every row appears exactly once.

    With a ``seed``: shuffled, sorted by length inside windows of ``window_batches`` batches,
    batches in shuffled order (a different order for each seed). Without one (evaluation,
    scoring): all rows sorted by length, stable, batches in order.
    """
    lengths = np.asarray(lengths)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if seed is None:
        order = np.argsort(lengths, kind="stable")
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths))
    window = batch_size * max(1, window_batches)
    batches: list[np.ndarray] = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def worker_share(rows: np.ndarray, index: int, count: int) -> np.ndarray:
    """Worker ``index`` of ``count``'s rows of a global batch (rows ``index::count``).

    A global batch smaller than the cluster is repeated first, so no worker is left without a
    batch (every worker must run every step).
    """
    if count <= 1:
        return rows
    return (rows if len(rows) >= count else np.resize(rows, count))[index::count]


def padding_fraction(lengths: np.ndarray, batches: list[np.ndarray], multiple: int, limit: int) -> float:
    """Padded positions as a fraction of all computed positions, for these batches and widths."""
    lengths = np.asarray(lengths)
    computed = sum(len(rows) * batch_width(lengths[rows].max(), multiple, limit) for rows in batches)
    real = int(np.minimum(lengths, limit).sum())
    return float(1.0 - real / computed) if computed else 0.0
