"""Pretraining stage: masked-language modelling of the encoder on the train split and unlabeled reviews.

BERT-style masking with KerasHub's ``MaskedLMMaskGenerator`` (15 % of real tokens selected; of
those 80 % become ``[MASK]``, 10 % a random token, 10 % stay) and ``MaskedLMHead`` tied to the
token embedding (``pipeline.model.build_masked_lm``).
"""

from __future__ import annotations

import math

from pipeline.text import CLS_ID, MASK_ID, PAD_ID, SEP_ID

MASK_RATE = 0.15


def mask_selection_length(width: int, rate: float = MASK_RATE) -> int:
    """Masked positions computed per row for a batch ``width`` tokens wide (at least 1)."""
    return max(1, math.ceil(rate * width))


def mask_generator(vocabulary_size: int, width: int, rate: float = MASK_RATE):
    """KerasHub's BERT-style mask generator for batches ``width`` tokens wide.

    Never selects ``[PAD]``, ``[CLS]`` or ``[SEP]``; selected tokens become ``[MASK]`` (80 %), a
    random token (10 %) or stay (10 %); its randomness follows TensorFlow's global seed. Called on ``[batch, width]`` ids it returns ``token_ids``,
    ``mask_positions``, ``mask_ids`` and ``mask_weights``.
    """
    import keras_hub

    return keras_hub.layers.MaskedLMMaskGenerator(
        vocabulary_size=vocabulary_size, mask_selection_rate=rate, mask_token_id=MASK_ID,
        mask_selection_length=mask_selection_length(width, rate), unselectable_token_ids=[PAD_ID, CLS_ID, SEP_ID])
