"""``make pretrain``'s output, the encoder backbone between stages: written by :func:`save_backbone`, read by every
stage downstream through :func:`load_backbone` from the folder :func:`resolve_pretrained` names, after
:func:`check_vocabulary` has made sure both used the same vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.config import Config
from pipeline.core.catalog import BACKBONE_SPEC_FILE, BACKBONE_WEIGHTS_FILE, require_output
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import atomic_write_json


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
    """The folder holding the pretrained backbone: ``model.pretrained`` (folder or ``runs:/`` URI) or
    ``data/pretrain``."""
    source = config.model.pretrained
    if not source:
        return require_output(config, "pretrain")
    if source.startswith("runs:/"):
        import mlflow

        from pipeline.tracking import setup_tracking

        setup_tracking(config.tracking)
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
        raise InputError(
            f"{source}: pretrained on a different vocabulary (sha256 {str(spec.get('vocabulary_sha256'))[:12]}, "
            f"this tokenizer {vocabulary_sha256[:12]}); rerun `make pretrain` after `make tokenize`"
        )
