"""Turning raw texts into class probabilities: the pyfunc models this pipeline logs and loads.

``TextTokenizer.encode`` (``pipeline.text.text_tokenizer``) then ``predict_ids`` (``pipeline.model.forward``) is the
single scoring path used by evaluation, batch scoring and the MLflow pyfunc model (``predict_probabilities`` chains the
two), so the same review gets the same probability from all three. It returns ``[N, k]`` class probabilities
(``pipeline.core.predictions``). Every pyfunc model the pipeline logs (:class:`PipelineModel`: the
Transformer :class:`SentimentClassifier`, the lexical :class:`LexicalClassifier`, the
:class:`FusedClassifier` of both) takes a DataFrame with a ``text`` column of raw strings and returns, for
two classes, ``positive_probability`` (the probability of the second label), ``predicted_label``
and ``score_error``; for more classes one ``probability_<label>`` column per class instead of
``positive_probability``. A row that cannot be scored (``pipeline.text.conventions.text_problem``: missing,
empty, whitespace-only or not text) gets an empty probability and label and the reason in
``score_error``, the same answer ``make score``, ``mlflow models predict/serve`` and Spark give.

This module and what it imports at load time stay free of the ingestion and download code; scikit-learn
is imported only when a lexical or fused model is loaded.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import joblib
import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from pipeline.config import LONG_REVIEWS
from pipeline.core.catalog import LABELS_FILE, TOKENIZER_SETTINGS_FILE
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import sha256_file
from pipeline.core.predictions import (
    cascade_rows,
    check_shape,
    fuse_probabilities,
    pool_windows,
    predicted_and_confidence,
    probability_columns,
)
from pipeline.model.explain import EXPLANATION_COLUMN, TOP_ITEMS, explain, explanation_text
from pipeline.model.forward import predict_ids
from pipeline.text.conventions import clean_text, load_labels, text_problem
from pipeline.text.crops import word_counts
from pipeline.text.ngram_counts import NgramCounts
from pipeline.text.text_tokenizer import load_text_tokenizer

ERROR_COLUMN = "score_error"  # why a row got no score ("" when it was scored)
ARTIFACT_KERAS_MODEL = "keras_model"  # names of the pyfunc models' artifacts (Transformers logged so far use the
ARTIFACT_TOKENIZER = "tokenizer"  # first two)
ARTIFACT_LEXICAL_MODEL = "lexical_model"
ARTIFACT_LABELS = "labels"  # a folder holding labels.json
ARTIFACT_FUSION = "fusion"  # fusion.json: the Transformer's weight
ARTIFACT_MODEL_SETTINGS = "model_settings"  # model_settings.json: how a Transformer reads a review


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
    return pd.DataFrame(
        {**columns, "predicted_label": pd.Series(names, dtype=object), ERROR_COLUMN: pd.Series(errors, dtype=object)}
    )


def output_columns(labels: Sequence[str], explain: bool = False) -> list[str]:
    return list(output_frame(np.zeros((0, len(labels))), labels).columns) + ([EXPLANATION_COLUMN] if explain else [])


def explanation_column(explanations: Sequence[str], errors: Sequence[str]) -> pd.Series:
    """``explanations`` of the scorable rows placed among all rows in order; a row with an error gets ""."""
    column = pd.Series([""] * len(errors), dtype=object)
    scorable = [i for i, error in enumerate(errors) if not error]
    if len(explanations) != len(scorable):
        raise ValueError(f"{len(explanations)} explanations for {len(scorable)} scorable rows")
    column.iloc[scorable] = list(explanations)
    return column


def load_keras_model(path: str | Path):
    import keras

    import pipeline.model.transformer  # noqa: F401  registers the custom layers before loading

    return keras.saving.load_model(path)


_LOADED: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()  # content key -> parts, newest last
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
    """The text tokenizer, labels and Keras model of a model folder, loaded once per process and per content.

    Keyed on the files' checksums, not their paths: ``mlflow.pyfunc.load_model`` copies a logged model
    into a new temporary folder on every call. Spark's Python workers (``mlflow.pyfunc.spark_udf``
    loads the pyfunc model once per task) and repeated loads in one process (``make bench``) then
    reuse one Keras model, and with it its compiled forward passes (about 0.5 s per batch shape here).
    Thread-safe: one load at a time.
    """
    with _LOADING:
        key = (
            _checksum(keras_model),
            _checksum(tokenizer / TOKENIZER_SETTINGS_FILE),
            _checksum(tokenizer / LABELS_FILE),
        )
        parts = _LOADED.get(key)
        if parts is None:
            parts = load_text_tokenizer(tokenizer), load_labels(tokenizer), load_keras_model(keras_model)
            _LOADED[key] = parts
            while len(_LOADED) > _LOADED_MAX:
                _LOADED.popitem(last=False)
        else:
            _LOADED.move_to_end(key)
        return parts


def read_model_settings(artifacts: dict) -> dict[str, str]:
    """A Transformer's own settings (``long_reviews``: ``truncate`` or ``windows``), from its ``model_settings.json``;
    a Transformer logged without one (before the settings travelled with the model) kept ``long_reviews`` in its
    tokenizer's ``tokenizer.json``, absent meaning ``truncate``."""
    if ARTIFACT_MODEL_SETTINGS in artifacts:
        path = Path(artifacts[ARTIFACT_MODEL_SETTINGS])
        if not path.is_file():
            raise MissingInputError(f"{path}: the model's settings are missing (the model folder is incomplete)")
    else:
        path = Path(artifacts[ARTIFACT_TOKENIZER]) / TOKENIZER_SETTINGS_FILE
    payload = json.loads(path.read_text()) if path.is_file() else {}
    long_reviews = payload.get("long_reviews", "truncate")
    if long_reviews not in LONG_REVIEWS:
        raise InputError(f"{path}: long_reviews is {long_reviews!r}, expected one of {', '.join(LONG_REVIEWS)}")
    return {"long_reviews": long_reviews}


class PipelineModel(PythonModel):
    """What every model this pipeline logs answers: a DataFrame ``text`` column of raw strings -> the
    probability columns, ``predicted_label`` and ``score_error``, one row per input row in order.

    A subclass loads its parts (``_load``) and turns texts into ``[N, k]`` probabilities in two steps:
    ``prepare`` (tokenizing, counting n-grams: what batch scoring runs ahead in a reader thread) and
    ``score`` (the model). Unscorable rows never reach either (``pipeline.text.conventions.text_problem``).
    """

    kind = "model"
    labels: list[str]

    @staticmethod
    def artifacts(*paths) -> dict[str, str]:
        """The ``artifacts=`` mapping to log with the model (read back by ``load_context``)."""
        raise NotImplementedError

    @classmethod
    def from_artifacts(cls, artifacts: dict) -> PipelineModel:
        """A loaded model from an ``artifacts`` mapping (what ``load_context`` gets from MLflow)."""
        model = cls()
        model._load({name: Path(path) for name, path in artifacts.items()})
        return model

    @classmethod
    def from_paths(cls, *paths) -> PipelineModel:
        """A loaded model from its files, in the order of ``artifacts``."""
        return cls.from_artifacts(cls.artifacts(*paths))

    def load_context(self, context):
        self._load({name: Path(path) for name, path in context.artifacts.items()})

    def _load(self, artifacts: dict[str, Path]) -> None:
        raise NotImplementedError

    def prepare(self, texts: Sequence[str]):
        raise NotImplementedError

    def score(self, prepared) -> np.ndarray:
        raise NotImplementedError

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        return self.score(self.prepare(list(texts)))

    def explanations(self, prepared, top: int) -> list[str]:
        """Per prepared text, the ``top`` words or n-grams that moved its log-odds most (``pipeline.model.explain``)."""
        return [explanation_text(explanation.items, top) for explanation in explain(self, prepared)]

    def predict(self, context, model_input, params=None):
        """The scored columns; ``params={"explain": True}`` (``explain_top``: how many items) adds
        ``explanation``, empty for the rows with an error."""
        if isinstance(model_input, pd.DataFrame):
            if "text" not in model_input.columns:
                raise InputError(f"input needs a 'text' column; it has {list(model_input.columns)}")
            texts = model_input["text"].tolist()
        else:
            texts = list(model_input)
        errors = [text_problem(text) for text in texts]
        prepared = self.prepare([text for text, error in zip(texts, errors) if not error])
        frame = output_frame(self.score(prepared), self.labels, errors)
        params = params or {}
        if params.get("explain"):
            frame[EXPLANATION_COLUMN] = explanation_column(
                self.explanations(prepared, int(params.get("explain_top", TOP_ITEMS))), errors
            )
        return frame


class SentimentClassifier(PipelineModel):
    """The Transformer: a ``.keras`` file and its tokenizer folder (the class name and artifact names are
    those of every Transformer logged so far: their pickles name this class).

    MLflow builds it empty and calls ``load_context`` with the logged artifacts; in the package,
    :meth:`from_paths` builds a loaded one.
    """

    kind = "transformer"

    @staticmethod
    def artifacts(
        keras_model: str | Path, tokenizer: str | Path, model_settings: str | Path | None = None
    ) -> dict[str, str]:
        artifacts = {ARTIFACT_KERAS_MODEL: str(keras_model), ARTIFACT_TOKENIZER: str(tokenizer)}
        if model_settings is not None:
            artifacts[ARTIFACT_MODEL_SETTINGS] = str(model_settings)
        return artifacts

    def _load(self, artifacts) -> None:
        self.settings = read_model_settings(artifacts)
        self.text_tokenizer, self.labels, self.model = _load_parts(
            Path(artifacts[ARTIFACT_KERAS_MODEL]), Path(artifacts[ARTIFACT_TOKENIZER])
        )

    @property
    def reads_windows(self) -> bool:
        """Whether a review longer than the limit is scored by windows (the model's ``long_reviews: windows``)."""
        return self.settings["long_reviews"] == "windows"

    def prepare(self, texts: Sequence[str]):
        """The texts' ids; when it :attr:`reads_windows`, (ids, owner): each text's row and the windows of those
        longer than the limit (``WordPieceTextTokenizer.encode_windows``)."""
        if self.reads_windows:
            return self.text_tokenizer.encode_windows(list(texts))
        return self.text_tokenizer.encode(list(texts))

    def score(self, prepared) -> np.ndarray:
        if isinstance(prepared, tuple):  # a text's windows pooled with its own row
            ids, owner = prepared
            return pool_windows(predict_ids(self.model, ids), owner)
        return predict_ids(self.model, prepared)


class LexicalClassifier(PipelineModel):
    """A scikit-learn text model (NBSVM): its ``joblib`` file and the class names.

    Texts get the same cleaning as at ingestion (``clean_text``) before the n-gram counts.
    """

    kind = "nbsvm"

    @staticmethod
    def artifacts(lexical_model: str | Path, labels_dir: str | Path) -> dict[str, str]:
        return {ARTIFACT_LEXICAL_MODEL: str(lexical_model), ARTIFACT_LABELS: str(labels_dir)}

    def _load(self, artifacts) -> None:
        self.lexical = joblib.load(Path(artifacts[ARTIFACT_LEXICAL_MODEL]))
        self.labels = load_labels(Path(artifacts[ARTIFACT_LABELS]))
        self.counts = NgramCounts(self.lexical.steps[0][1])  # the fitted vectorizer's counts, computed faster

    def prepare(self, texts: Sequence[str]):
        return self.counts.transform([clean_text(text) for text in texts])  # the costly part, run ahead

    def score(self, prepared) -> np.ndarray:
        classifier = self.lexical.steps[-1][1]
        probabilities = np.zeros((prepared.shape[0], len(self.labels)), dtype=np.float32)
        if prepared.shape[0]:
            probabilities[:, np.asarray(classifier.classes_, dtype=int)] = classifier.predict_proba(prepared)
        return probabilities


class FusedClassifier(PipelineModel):
    """A Transformer and a lexical model in one artifact: their log-probabilities averaged with the weight
    chosen on validation (:func:`fuse_probabilities`; ``fusion.json`` holds it). A length-aware fusion also holds
    ``short_transformer_weight`` and ``short_max_words``: texts of at most that many words (``word_counts``) get
    that weight instead. A cascade (``cascade_threshold``) runs its Transformer only on the texts whose lexical
    confidence is at most the threshold (``cascade_rows``); the others get the lexical model's probabilities.

    ``prepare`` gives (ids of the Transformer's texts, n-gram counts of every text, every text's weight, the rows the
    Transformer reads or None for every row)."""

    kind = "fusion"

    @staticmethod
    def artifacts(keras_model, tokenizer, lexical_model, fusion_file, model_settings=None) -> dict[str, str]:
        return {
            **SentimentClassifier.artifacts(keras_model, tokenizer, model_settings),
            **FusedClassifier.lexical_artifacts(lexical_model, tokenizer, fusion_file),
        }

    @staticmethod
    def lexical_artifacts(lexical_model, labels_dir, fusion_file) -> dict[str, str]:
        """The artifacts a fusion adds to its Transformer's: the lexical model, its labels and the weight."""
        return {**LexicalClassifier.artifacts(lexical_model, labels_dir), ARTIFACT_FUSION: str(fusion_file)}

    def _load(self, artifacts) -> None:
        self.transformer = SentimentClassifier()
        self.transformer._load(artifacts)
        self.lexical = LexicalClassifier()
        self.lexical._load(artifacts)
        settings = json.loads(Path(artifacts[ARTIFACT_FUSION]).read_text())
        self.weight = float(settings["transformer_weight"])
        self.short_max_words = int(settings.get("short_max_words", 0))  # 0: one weight for every text
        self.short_weight = float(settings.get("short_transformer_weight", self.weight))
        threshold = settings.get("cascade_threshold")  # None: the Transformer reads every text
        self.cascade_threshold = None if threshold is None else float(threshold)
        self.transformer_run_id = settings.get("transformer_run_id")  # where its Transformer was trained
        self.lexical_run_id = settings.get("lexical_run_id")  # and its lexical model
        self.labels = self.transformer.labels
        if self.lexical.labels != self.labels or settings.get("labels", self.labels) != self.labels:
            raise InputError(
                f"fused model: the Transformer's labels {self.labels} differ from the lexical model's "
                f"{self.lexical.labels}"
            )

    def row_weights(self, texts: Sequence[str]) -> np.ndarray:
        """The Transformer's weight for each text: ``short_weight`` up to ``short_max_words`` words, else ``weight``."""
        if not self.short_max_words:
            return np.full(len(texts), self.weight)
        words = word_counts([clean_text(text) for text in texts])  # as the parts read them
        return np.where(words <= self.short_max_words, self.short_weight, self.weight)

    def prepare(self, texts: Sequence[str]):
        # a part with weight 0 cannot change the answer: it is not run (validation may give all weight to one)
        weights = self.row_weights(texts)
        runs_transformer = max(self.weight, self.short_weight) > 0
        runs_lexical = min(self.weight, self.short_weight) < 1
        counts = self.lexical.prepare(texts) if runs_lexical else None
        routed = None
        if runs_transformer and runs_lexical and self.cascade_threshold is not None:
            routed = np.flatnonzero(cascade_rows(self.lexical.score(counts), self.cascade_threshold))
            texts = [texts[int(row)] for row in routed]
        return (self.transformer.prepare(texts) if runs_transformer else None, counts, weights, routed)

    def score(self, prepared) -> np.ndarray:
        ids, counts, weights, routed = prepared
        if routed is not None:  # the cascade: the lexical model's answer where it is sure, the fusion elsewhere
            answer = self.lexical.score(counts)
            if len(routed):
                answer[routed] = fuse_probabilities(self.transformer.score(ids), answer[routed], weights[routed])
            return answer
        transformer = self.transformer.score(ids) if ids is not None else None
        lexical = self.lexical.score(counts) if counts is not None else None
        if transformer is None:  # one part alone is fused with itself
            if lexical is None:
                raise ValueError("a fused model scored neither part (both weights leave a part out)")
            transformer = lexical
        elif lexical is None:
            lexical = transformer
        return fuse_probabilities(transformer, lexical, weights)


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
    return classifier
