"""The encoder backbone between stages: masked-LM batches to pretrain it, and its saved weights.

The pretrain stage (``pipeline/stages/pretrain/__init__.py``) trains a backbone on masked-LM batches from
:func:`masked_lm_dataset` and saves it with :func:`save_backbone`; the train stage loads it with
:func:`load_backbone` from the folder :func:`resolve_pretrained` names, after
:func:`check_vocabulary` has made sure both used the same vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from pipeline.config import Config
from pipeline.core.catalog import require_output
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import BACKBONE_SPEC_FILE, BACKBONE_WEIGHTS_FILE, atomic_write_json
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
        vocabulary_size=vocabulary_size, mask_selection_rate=rate, mask_token_id=MASK_ID,
        mask_selection_length=mask_selection_length(width, rate), unselectable_token_ids=[PAD_ID, CLS_ID, SEP_ID])


def masked_lm_dataset(ids: np.ndarray, batch_size: int, vocabulary_size: int, seed: int, rate: float,
                      shard: tuple[int, int] = (0, 1), length_multiple: int = TRAINING_LENGTH_MULTIPLE):
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
                yield ({"token_ids": masked["token_ids"], "mask_positions": masked["mask_positions"]},
                       masked["mask_ids"], masked["mask_weights"])

    signature = ({"token_ids": tf.TensorSpec((None, None), tf.int32),
                  "mask_positions": tf.TensorSpec((None, None), tf.int32)},
                 tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None, None), tf.float32))
    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    return (already_sharded(dataset) if count > 1 else dataset).prefetch(2)


# --------------------------------------------------------------------------- saved backbone


def save_backbone(directory: Path, weights: dict[str, list], spec: dict) -> None:
    """``backbone.weights.npz`` (``<layer>/<index>`` arrays) and ``backbone.json``, each written atomically."""
    arrays = {f"{name}/{index}": value for name, values in weights.items() for index, value in enumerate(values)}
    tmp = directory / f".{BACKBONE_WEIGHTS_FILE}.tmp.npz"
    np.savez(tmp, **arrays)
    tmp.replace(directory / BACKBONE_WEIGHTS_FILE)
    atomic_write_json(directory / BACKBONE_SPEC_FILE, spec)


def load_backbone(directory: Path, check_only: bool = False) -> tuple[dict[str, list], dict]:
    """(weights by layer name, spec) saved by :func:`save_backbone`; ``check_only`` just checks the files exist."""
    for name in (BACKBONE_WEIGHTS_FILE, BACKBONE_SPEC_FILE):
        if not (directory / name).is_file():
            raise MissingInputError(f"no pretrained backbone at {directory}: {name} is missing (run `make pretrain`)")
    if check_only:
        return {}, {}
    spec = json.loads((directory / BACKBONE_SPEC_FILE).read_text())
    weights: dict[str, list] = {}
    with np.load(directory / BACKBONE_WEIGHTS_FILE) as arrays:
        for key in sorted(arrays.files, key=lambda k: (k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1]))):
            weights.setdefault(key.rsplit("/", 1)[0], []).append(arrays[key])
    return weights, spec


def resolve_pretrained(config: Config) -> Path:
    """The folder holding the pretrained backbone: ``model.pretrained`` (folder or ``runs:/`` URI) or ``data/pretrain``."""
    source = config.model.pretrained
    if not source:
        return require_output(config, "pretrain")
    if source.startswith("runs:/"):
        import mlflow

        from pipeline.tracking import setup_tracking

        setup_tracking(config)
        try:
            return Path(mlflow.artifacts.download_artifacts(source))
        except (mlflow.exceptions.MlflowException, OSError) as exc:
            raise InputError(f"cannot fetch pretrained backbone {source!r}: {exc}") from None
    path = Path(source).expanduser()
    if not path.is_dir():
        raise MissingInputError(f"model.pretrained: no folder {path}")
    return path


def check_vocabulary(spec: dict, vocabulary_sha256: str, source: str) -> None:
    if spec.get("vocabulary_sha256") != vocabulary_sha256:
        raise InputError(f"{source}: pretrained on a different vocabulary (sha256 {str(spec.get('vocabulary_sha256'))[:12]}, "
                         f"this tokenizer {vocabulary_sha256[:12]}); rerun `make pretrain` after `make tokenize`")


