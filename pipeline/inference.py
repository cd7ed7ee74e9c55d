"""Turning raw texts into probabilities with a trained model and its saved tokenizer.

``predict_probabilities`` is the single scoring path used by evaluation, batch scoring and
the MLflow pyfunc model, so the same review gets the same probability from all three.
``SentimentClassifier`` is that pyfunc model: it takes a DataFrame with a ``text`` column
of raw strings and returns ``positive_probability`` and ``predicted_label``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import mlflow
import numpy as np
import pandas as pd

from pipeline.tokenization import PAD_ID, TextEncoder

LABEL_NAMES = ("negative", "positive")
LENGTH_BUCKET = 32  # batches are trimmed of trailing padding to a multiple of this


def predict_ids(model, ids: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Positive-class probability for encoded rows, trimming trailing padding per batch.

    Rows are grouped by length so short reviews are not run through the full
    ``max_sequence_length``; the padding mask makes the result independent of padding.
    """
    ids = np.asarray(ids)
    probabilities = np.empty(len(ids), dtype=np.float32)
    if not len(ids):
        return probabilities
    lengths = (ids != PAD_ID).sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(ids), batch_size):
        rows = order[start:start + batch_size]
        width = int(min(ids.shape[1], -(-int(lengths[rows].max()) // LENGTH_BUCKET) * LENGTH_BUCKET))
        batch = ids[rows, :width]
        probabilities[rows] = np.asarray(model(batch, training=False), dtype=np.float32).reshape(-1)
    return probabilities


def predict_probabilities(model, encoder: TextEncoder, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    return predict_ids(model, encoder.encode(list(texts)), batch_size)


def label_names(probabilities: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    return np.where(probabilities >= threshold, LABEL_NAMES[1], LABEL_NAMES[0])


def load_keras_model(path: str | Path):
    import keras

    import pipeline.model  # noqa: F401  registers the custom layers before loading

    return keras.saving.load_model(path)


class SentimentClassifier(mlflow.pyfunc.PythonModel):
    """MLflow pyfunc: DataFrame ``text`` column of raw strings -> probability and label."""

    def load_context(self, context):
        self.encoder = TextEncoder.load(context.artifacts["tokenizer"])
        self.model = load_keras_model(context.artifacts["keras_model"])

    def predict(self, context, model_input, params=None):
        if isinstance(model_input, pd.DataFrame):
            if "text" not in model_input.columns:
                raise ValueError(f"input needs a 'text' column; it has {list(model_input.columns)}")
            texts = model_input["text"]
        else:
            texts = pd.Series(model_input)
        texts = texts.fillna("").astype(str).tolist()
        probabilities = predict_probabilities(self.model, self.encoder, texts)
        return pd.DataFrame({"positive_probability": probabilities.astype(np.float64),
                             "predicted_label": label_names(probabilities)})
