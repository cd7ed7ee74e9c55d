"""Turning raw texts into probabilities with a trained model and its saved tokenizer.

``predict_probabilities`` is the single scoring path used by evaluation, batch scoring and
the MLflow pyfunc model, so the same review gets the same probability from all three.
``SentimentClassifier`` is that pyfunc model: it takes a DataFrame with a ``text`` column
of raw strings and returns, for two classes, ``positive_probability`` (the probability of
the second label) and ``predicted_label``; for more classes one ``probability_<label>``
column per class and ``predicted_label``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import mlflow
import numpy as np
import pandas as pd

from pipeline.ingest import IMDB_LABELS, LABELS_FILE
from pipeline.tokenization import PAD_ID, TextEncoder

LENGTH_BUCKET = 32  # batches are trimmed of trailing padding to a multiple of this


def predict_ids(model, ids: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Class probabilities for encoded rows: ``[N]`` (class 1) for two classes, else ``[N, k]``.

    Rows are grouped by length so short reviews are not run through the full
    ``max_sequence_length``; the padding mask makes the result independent of padding.
    """
    ids = np.asarray(ids)
    width_out = int(model.output_shape[-1])
    probabilities = np.empty((len(ids), width_out), dtype=np.float32)
    if len(ids):
        lengths = (ids != PAD_ID).sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(ids), batch_size):
            rows = order[start:start + batch_size]
            width = int(min(ids.shape[1], -(-int(lengths[rows].max()) // LENGTH_BUCKET) * LENGTH_BUCKET))
            probabilities[rows] = np.asarray(model(ids[rows, :width], training=False), dtype=np.float32)
    return probabilities[:, 0] if width_out == 1 else probabilities


def predict_probabilities(model, encoder: TextEncoder, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    return predict_ids(model, encoder.encode(list(texts)), batch_size)


def predicted_indices(probabilities: np.ndarray) -> np.ndarray:
    """Class index per row: threshold 0.5 on the class-1 probability, or the arg-max."""
    probabilities = np.asarray(probabilities)
    if probabilities.ndim == 1:
        return (probabilities >= 0.5).astype(np.int64)
    return probabilities.argmax(axis=1)


def output_frame(probabilities: np.ndarray, labels: Sequence[str]) -> pd.DataFrame:
    """The scored columns: ``positive_probability`` (two classes) or ``probability_<label>``s, and ``predicted_label``."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    names = np.asarray(labels, dtype=object)[predicted_indices(probabilities)] if len(probabilities) else []
    if probabilities.ndim == 1:
        columns = {"positive_probability": probabilities}
    else:
        columns = {f"probability_{label}": probabilities[:, i] for i, label in enumerate(labels)}
    return pd.DataFrame({**columns, "predicted_label": pd.Series(names, dtype=object)})


def output_columns(labels: Sequence[str]) -> list[str]:
    return list(output_frame(np.zeros((0,) if len(labels) == 2 else (0, len(labels))), labels).columns)


def load_labels(directory: str | Path) -> list[str]:
    """Class names saved with a tokenizer; models from before labels were saved are IMDB's."""
    path = Path(directory) / LABELS_FILE
    return json.loads(path.read_text())["labels"] if path.is_file() else list(IMDB_LABELS)


def load_keras_model(path: str | Path):
    import keras

    import pipeline.model  # noqa: F401  registers the custom layers before loading

    return keras.saving.load_model(path)


class SentimentClassifier(mlflow.pyfunc.PythonModel):
    """MLflow pyfunc: DataFrame ``text`` column of raw strings -> probabilities and label."""

    def load_context(self, context):
        self.encoder = TextEncoder.load(context.artifacts["tokenizer"])
        self.labels = load_labels(context.artifacts["tokenizer"])
        self.model = load_keras_model(context.artifacts["keras_model"])

    def predict(self, context, model_input, params=None):
        if isinstance(model_input, pd.DataFrame):
            if "text" not in model_input.columns:
                raise ValueError(f"input needs a 'text' column; it has {list(model_input.columns)}")
            texts = model_input["text"]
        else:
            texts = pd.Series(model_input)
        texts = texts.fillna("").astype(str).tolist()
        return output_frame(predict_probabilities(self.model, self.encoder, texts), self.labels)


def load_classifier(model_uri: str) -> "SentimentClassifier":
    """The pipeline's pyfunc model behind ``model_uri`` (models:/, runs:/ or a folder), unwrapped."""
    try:
        model = mlflow.pyfunc.load_model(model_uri)
        classifier = model.unwrap_python_model()
    except Exception as exc:  # MLflow raises many types for a bad URI; the user needs the URI
        raise ValueError(f"cannot load model {model_uri!r}: {exc}") from None
    if not isinstance(classifier, SentimentClassifier):
        raise ValueError(f"model {model_uri!r} is not a sentiment model logged by this pipeline")
    return classifier
