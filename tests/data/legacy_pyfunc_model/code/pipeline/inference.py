"""Turning raw texts into class probabilities with a trained model and its saved tokenizer.

``TextEncoder.encode`` then ``predict_ids`` is the single scoring path used by evaluation, batch
scoring and the MLflow pyfunc model (``predict_probabilities`` chains the two), so the same review
gets the same probability from all three. It returns ``[N, k]`` class probabilities
(``pipeline.predictions``). ``SentimentClassifier`` is
the pyfunc model: it takes a DataFrame with a ``text`` column of raw strings and returns, for
two classes, ``positive_probability`` (the probability of the second label), ``predicted_label``
and ``score_error``; for more classes one ``probability_<label>`` column per class instead of
``positive_probability``. A row that cannot be scored (``pipeline.text.text_problem``: missing,
empty, whitespace-only or not text) gets an empty probability and label and the reason in
``score_error``, the same answer ``make score``, ``mlflow models predict/serve`` and Spark give.

This module and what it imports stay free of the ingestion, download and scikit-learn code,
so a logged model loads wherever Keras, KerasHub and MLflow are installed.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import weakref
from pathlib import Path
from typing import Sequence

import mlflow
import numpy as np
import pandas as pd

from pipeline.artifacts import sha256_file
from pipeline.batching import batch_width, bucketed_batches
from pipeline.errors import InputError
from pipeline.predictions import as_class_probabilities, check_shape, predicted_and_confidence, probability_columns
from pipeline.text import LABELS_FILE, PAD_ID, load_labels, text_problem
from pipeline.tokenization import SETTINGS_FILE, TextEncoder

LENGTH_MULTIPLE = 32  # batch widths: multiples of this (8 widths for 256 tokens) keep compiled shapes few
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
ERROR_COLUMN = "score_error"  # why a row got no score ("" when it was scored)
ARTIFACT_KERAS_MODEL = "keras_model"  # names of the pyfunc model's artifacts (models logged so far use them)
ARTIFACT_TOKENIZER = "tokenizer"


def _expected_retracing(record: logging.LogRecord) -> bool:
    """Drop TensorFlow's "triggered tf.function retracing" warning for this module's forward pass:
    one trace per (batch, width) shape is the design, not a mistake a user should be told about."""
    message = record.getMessage()
    return not ("retracing" in message and "compiled_forward" in message)


def compiled_forward(model):
    """``model(ids, training=False)`` compiled with XLA, one executable per input shape, cached per model.

    Eager calls pay Python and op-dispatch overhead on every batch, and XLA fuses the
    element-wise work (layer norms, GELU, softmax) that dominates a small encoder. Callers keep
    the shapes to a small fixed set (full batches, widths in multiples of ``LENGTH_MULTIPLE``);
    each new shape compiles once, in well under a second for the default model here.
    """
    forward = _COMPILED.get(model)
    if forward is None:
        import tensorflow as tf

        logging.getLogger("tensorflow").addFilter(_expected_retracing)
        reference = weakref.ref(model)  # the cache must not keep the model alive
        forward = tf.function(lambda ids: reference()(ids, training=False), jit_compile=True)
        _COMPILED[model] = forward
    return forward


def predict_ids(model, ids: np.ndarray, batch_size: int = 256, compiled: bool = True) -> np.ndarray:
    """Class probabilities ``[N, k]`` for encoded rows.

    Rows are grouped by length (``pipeline.batching``) so short reviews are not run through
    the full ``max_sequence_length``; the padding mask makes the result independent of
    padding, which also lets the compiled path pad a short last batch to the full batch size
    (one shape per width). ``compiled=False`` calls the model eagerly, batch by batch: the
    reference path.
    """
    ids = np.asarray(ids, dtype=np.int32)
    classes = as_class_probabilities(np.zeros((1, int(model.output_shape[-1])))).shape[1]
    probabilities = np.empty((len(ids), classes), dtype=np.float32)
    lengths = (ids != PAD_ID).sum(axis=1)
    forward = compiled_forward(model) if compiled else None
    # a small input is one batch, padded up to a power of two: a bounded set of compiled shapes
    batch_size = min(batch_size, 1 << max(len(ids) - 1, 0).bit_length())
    for rows in bucketed_batches(lengths, batch_size, seed=None):
        batch = ids[rows, :batch_width(lengths[rows].max(), LENGTH_MULTIPLE, ids.shape[1])]
        if forward is None:
            probabilities[rows] = as_class_probabilities(model(batch, training=False))
        else:
            padded = np.pad(batch, ((0, batch_size - len(rows)), (0, 0)), constant_values=PAD_ID)
            probabilities[rows] = as_class_probabilities(forward(padded))[:len(rows)]
    return probabilities


def predict_probabilities(model, encoder: TextEncoder, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    return predict_ids(model, encoder.encode(list(texts)), batch_size)


def output_frame(probabilities: np.ndarray, labels: Sequence[str], errors: Sequence[str] | None = None) -> pd.DataFrame:
    """The scored columns, one row per input row in order.

    ``positive_probability`` (two classes) or one ``probability_<label>`` per class,
    ``predicted_label`` and ``score_error``. ``probabilities`` holds the rows without an error
    (``errors[i] == ""``), in order; a row with an error gets ``None`` probabilities (an empty CSV
    cell, JSON ``null`` from ``mlflow models serve`` where NaN would not be valid JSON, a Spark null),
    an empty label and its message; the probability columns are then of object dtype (float64 when
    every row was scored). Without ``errors`` every row was scored.
    """
    errors = [""] * len(probabilities) if errors is None else list(errors)
    scorable = np.array([not error for error in errors], dtype=bool)
    probabilities = check_shape(probabilities, len(labels))
    if len(probabilities) != scorable.sum():
        raise ValueError(f"{len(probabilities)} probability rows for {int(scorable.sum())} scorable rows")
    full = np.full((len(errors), len(labels)), np.nan)
    full[scorable] = probabilities
    names = np.full(len(errors), "", dtype=object)
    names[scorable] = np.asarray(labels, dtype=object)[predicted_and_confidence(probabilities)[0]]
    columns = probability_columns(full, labels)
    if not scorable.all():  # None, not NaN: MLflow's JSON writer would send NaN, which JSON does not allow
        columns = {name: pd.Series(values, dtype=object).where(scorable, None) for name, values in columns.items()}
    return pd.DataFrame({**columns, "predicted_label": pd.Series(names, dtype=object),
                         ERROR_COLUMN: pd.Series(errors, dtype=object)})


def output_columns(labels: Sequence[str]) -> list[str]:
    return list(output_frame(np.zeros((0, len(labels))), labels).columns)


def load_keras_model(path: str | Path):
    import keras

    import pipeline.model  # noqa: F401  registers the custom layers before loading

    return keras.saving.load_model(path)


_LOADED: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()  # content key -> parts, newest last
_LOADED_MAX = 2
_LOADING = threading.Lock()
_CHECKSUMS: dict[tuple, str] = {}  # (path, size, mtime) -> sha256: a file hashed once per process


def _checksum(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CHECKSUMS:
        _CHECKSUMS[key] = sha256_file(path)
    return _CHECKSUMS[key]


def _load_parts(keras_model: Path, tokenizer: Path):
    """The encoder, labels and Keras model of a model folder, loaded once per process and per content.

    Keyed on the files' checksums, not their paths: ``mlflow.pyfunc.load_model`` copies a logged model
    into a new temporary folder on every call. Spark's Python workers (``mlflow.pyfunc.spark_udf``
    loads the pyfunc model once per task) and repeated loads in one process (``make bench``) then
    reuse one Keras model, and with it its compiled forward passes (about 0.5 s per batch shape here).
    Thread-safe: one load at a time.
    """
    with _LOADING:
        key = (_checksum(keras_model), _checksum(tokenizer / SETTINGS_FILE), _checksum(tokenizer / LABELS_FILE))
        parts = _LOADED.get(key)
        if parts is None:
            parts = TextEncoder.load(tokenizer), load_labels(tokenizer), load_keras_model(keras_model)
            _LOADED[key] = parts
            while len(_LOADED) > _LOADED_MAX:
                _LOADED.popitem(last=False)
        else:
            _LOADED.move_to_end(key)
        return parts


class SentimentClassifier(mlflow.pyfunc.PythonModel):
    """MLflow pyfunc: DataFrame ``text`` column of raw strings -> probabilities and label.

    MLflow builds it empty and calls ``load_context`` with the logged artifacts; in the
    package, :meth:`from_paths` builds a loaded one from a ``.keras`` file and a tokenizer folder.
    """

    @classmethod
    def from_paths(cls, keras_model: str | Path, tokenizer: str | Path) -> "SentimentClassifier":
        classifier = cls()
        classifier._load(Path(keras_model), Path(tokenizer))
        return classifier

    @staticmethod
    def artifacts(keras_model: str | Path, tokenizer: str | Path) -> dict[str, str]:
        """The ``artifacts=`` mapping to log with the model (read back by ``load_context``)."""
        return {ARTIFACT_KERAS_MODEL: str(keras_model), ARTIFACT_TOKENIZER: str(tokenizer)}

    def load_context(self, context):
        self._load(Path(context.artifacts[ARTIFACT_KERAS_MODEL]), Path(context.artifacts[ARTIFACT_TOKENIZER]))

    def _load(self, keras_model: Path, tokenizer: Path) -> None:
        self.encoder, self.labels, self.model = _load_parts(Path(keras_model), Path(tokenizer))

    def predict(self, context, model_input, params=None):
        if isinstance(model_input, pd.DataFrame):
            if "text" not in model_input.columns:
                raise InputError(f"input needs a 'text' column; it has {list(model_input.columns)}")
            texts = model_input["text"].tolist()
        else:
            texts = list(model_input)
        errors = [text_problem(text) for text in texts]
        scorable = [text for text, error in zip(texts, errors) if not error]
        return output_frame(predict_probabilities(self.model, self.encoder, scorable), self.labels, errors)


def load_classifier(model_uri: str) -> "SentimentClassifier":
    """The pipeline's pyfunc model behind ``model_uri`` (models:/, runs:/ or a folder), unwrapped."""
    saved_path = list(sys.path)
    try:
        model = mlflow.pyfunc.load_model(model_uri)
    except (mlflow.exceptions.MlflowException, OSError) as exc:  # a bad URI, a missing run or folder
        raise InputError(f"cannot load model {model_uri!r}: {exc}") from None
    finally:
        # MLflow puts the model's logged copy of this package first on sys.path. This process already
        # runs the package, so the copy would only shadow it for later imports and for spawned
        # worker processes (which inherit sys.path) that then unpickle today's objects with old code.
        sys.path[:] = saved_path
    try:
        classifier = model.unwrap_python_model()
    except mlflow.exceptions.MlflowException:  # a model of another flavor
        classifier = None
    if not isinstance(classifier, SentimentClassifier):
        raise InputError(f"model {model_uri!r} is not a sentiment model logged by this pipeline")
    return classifier
