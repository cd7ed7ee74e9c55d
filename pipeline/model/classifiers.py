"""Loading the pyfunc models this pipeline logs: :func:`load_classifier` turns a ``models:/``, ``runs:/`` or folder
URI into the kind's class (``pipeline.model.kinds``), unwrapped from MLflow.

Every kind takes a DataFrame with a ``text`` column of raw strings and returns, for two classes,
``positive_probability`` (the probability of the second label), ``predicted_label`` and ``score_error``; for more
classes one ``probability_<label>`` column per class instead of ``positive_probability``
(``pipeline.model.kinds.base``). The kinds' classes are also importable from here, under the module name the pickles
of every model logged before the kinds had modules of their own name them.

This module and what it imports at load time stay free of the ingestion and download code; scikit-learn is imported
only when a lexical or fused model is loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlflow
from mlflow.pyfunc import PyFuncModel

from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.predictions import fuse_probabilities
from pipeline.model.forward import predict_ids
from pipeline.model.kinds import KINDS, kind_of
from pipeline.model.kinds.base import (
    ARTIFACT_FUSION,
    ARTIFACT_KERAS_MODEL,
    ARTIFACT_LABELS,
    ARTIFACT_LEXICAL_MODEL,
    ARTIFACT_MODEL_SETTINGS,
    ARTIFACT_TOKENIZER,
    ERROR_COLUMN,
    PipelineModel,
    explanation_column,
    output_columns,
    output_frame,
)
from pipeline.model.kinds.fusion_classifier import FusedClassifier
from pipeline.model.kinds.nbsvm_classifier import LexicalClassifier
from pipeline.model.kinds.transformer_classifier import SentimentClassifier, load_keras_model, read_model_settings

__all__ = [
    "ARTIFACT_FUSION",
    "ARTIFACT_KERAS_MODEL",
    "ARTIFACT_LABELS",
    "ARTIFACT_LEXICAL_MODEL",
    "ARTIFACT_MODEL_SETTINGS",
    "ARTIFACT_TOKENIZER",
    "ERROR_COLUMN",
    "KINDS",
    "FusedClassifier",
    "LexicalClassifier",
    "PipelineModel",
    "SentimentClassifier",
    "check_model_uri",
    "explanation_column",
    "fuse_probabilities",
    "kind_of",
    "load_classifier",
    "load_keras_model",
    "load_pyfunc_model",
    "output_columns",
    "output_frame",
    "predict_ids",
    "read_model_settings",
]


def check_model_uri(model_uri: str) -> str:
    """``model_uri`` as given; an error naming it when it is a folder (no ``scheme:``) that is not there
    (MLflow would say "no such artifact", or a server process would print its own traceback)."""
    if ":" not in model_uri and not Path(model_uri).is_dir():
        raise MissingInputError(
            f"no model folder {model_uri} (a model is models:/NAME@ALIAS, runs:/RUN_ID/model or a folder)"
        )
    return model_uri


def load_classifier(model_uri: str) -> PipelineModel:
    """The pipeline's pyfunc model behind ``model_uri`` (models:/, runs:/ or a folder), unwrapped: a
    Transformer, a lexical model or a fused one."""
    return load_pyfunc_model(model_uri).unwrap_python_model()


def load_pyfunc_model(model_uri: str) -> PyFuncModel:
    """The pyfunc model behind ``model_uri`` as MLflow serves it, checked to wrap one of this pipeline's
    classifiers (``unwrap_python_model()``)."""
    check_model_uri(model_uri)
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
    if not isinstance(classifier, PipelineModel):
        raise InputError(f"model {model_uri!r} is not a sentiment model logged by this pipeline")
    return model
