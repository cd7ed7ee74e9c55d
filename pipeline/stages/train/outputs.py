"""The readers of ``make train``'s outputs, for every stage downstream of it.

A run folder (``data/train/<run folder>/``) holds ``model.keras``, the tokenizer it was trained with
(``tokenizer/``), the model's own settings (``model_settings.json``: how it reads a long review), ``history.json``
and the manifest. Folders written before the model had its own settings keep them in ``tokenizer/tokenizer.json``;
``pipeline.model.classifiers.read_model_settings`` reads either.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.catalog import KERAS_MODEL_FILE, MODEL_SETTINGS_FILE, TOKENIZER_DIR
from pipeline.model.classifiers import SentimentClassifier


def transformer_artifacts(run_dir: Path) -> dict[str, str]:
    """The pyfunc artifacts of the Transformer in ``run_dir`` (what its MLflow model and a fused model log)."""
    settings = run_dir / MODEL_SETTINGS_FILE
    return SentimentClassifier.artifacts(
        run_dir / KERAS_MODEL_FILE, run_dir / TOKENIZER_DIR, settings if settings.is_file() else None
    )
