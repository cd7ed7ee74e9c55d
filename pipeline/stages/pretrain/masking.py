"""Masked-LM batches to pretrain the encoder on: which tokens are hidden, and the length-bucketed ``tf.data`` input.

The pretrain stage (``masked_lm``) trains on :func:`masked_lm_dataset` and saves the backbone with
``outputs.save_backbone``.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.runtime.batching import TRAINING_LENGTH_MULTIPLE, batch_width, bucketed_batches, worker_share
from pipeline.runtime.hardware import already_sharded
from pipeline.text.conventions import CLS_ID, MASK_ID, PAD_ID, SEP_ID

# --------------------------------------------------------------------------- masking


def mask_selection_length(width: int, rate: float) -> int:
    """Masked positions computed per row for a batch ``width`` tokens wide (at least 1)."""
    return max(1, math.ceil(rate * width))


def mask_generator(vocabulary_size: int, width: int, rate: float):
    """KerasHub's BERT-style mask generator for batches ``width`` tokens wide.

    Never selects ``[PAD]``, ``[CLS]`` or ``[SEP]``; selected tokens become ``[MASK]`` (80 %), a
    random token (10 %) or stay (10 %); its randomness follows TensorFlow's global seed. Called
    on ``[batch, width]`` ids it returns ``token_ids``, ``mask_positions``, ``mask_ids`` and
    ``mask_weights``. ``rate`` is ``pretrain.mask_rate``.
    """
    import keras_hub

    return keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=vocabulary_size,
        mask_selection_rate=rate,
        mask_token_id=MASK_ID,
        mask_selection_length=mask_selection_length(width, rate),
        unselectable_token_ids=[PAD_ID, CLS_ID, SEP_ID],
    )


def masked_lm_dataset(
    ids: np.ndarray,
    batch_size: int,
    vocabulary_size: int,
    seed: int,
    rate: float,
    shard: tuple[int, int] = (0, 1),
    length_multiple: int = TRAINING_LENGTH_MULTIPLE,
):
    """Endless ``({"token_ids", "mask_positions"}, mask_ids, mask_weights)`` batches, length-bucketed,
    a new order every pass over ``ids``.

    ``shard=(index, count)``: every worker of a cluster draws the same global batches of
    ``batch_size`` rows and keeps rows ``index::count`` of each (as the train stage's ``make_dataset``).
    """
    import tensorflow as tf

    index, count = shard
    lengths = (ids != PAD_ID).sum(axis=1)
    generators: dict[int, object] = {}

    def batches():
        for epoch in range(10**9):
            for rows in bucketed_batches(lengths, batch_size, seed + epoch):
                rows = worker_share(rows, index, count)
                width = batch_width(lengths[rows].max(), length_multiple, ids.shape[1])
                generator = generators.setdefault(width, mask_generator(vocabulary_size, width, rate))
                masked = generator(ids[rows, :width])
                yield (
                    {"token_ids": masked["token_ids"], "mask_positions": masked["mask_positions"]},
                    masked["mask_ids"],
                    masked["mask_weights"],
                )

    signature = (
        {"token_ids": tf.TensorSpec((None, None), tf.int32), "mask_positions": tf.TensorSpec((None, None), tf.int32)},
        tf.TensorSpec((None, None), tf.int32),
        tf.TensorSpec((None, None), tf.float32),
    )
    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    return (already_sharded(dataset) if count > 1 else dataset).prefetch(2)
