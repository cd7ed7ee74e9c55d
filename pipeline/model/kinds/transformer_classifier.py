"""The Transformer kind: a ``.keras`` file and its tokenizer folder, scored by ``TextTokenizer.encode`` then
``predict_ids`` (``pipeline.model.forward``), the single scoring path of evaluation, batch scoring, serving and Spark.

It owns what is particular to it: loading (once per process and per content), reading long reviews whole by
windows when its settings say so, integrated-gradients explanations, its TensorFlow graph for the export and its
model-card lines. Keras and TensorFlow are imported when a model is loaded or exported, not when this module is.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from pipeline.config import LONG_REVIEWS
from pipeline.core.catalog import LABELS_FILE, TOKENIZER_SETTINGS_FILE
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import sha256_file
from pipeline.core.logs import start_tensorflow_quietly
from pipeline.core.predictions import pool_windows
from pipeline.model.explain import IG_STEPS, Explanation, transformer_explanations
from pipeline.model.forward import forward_pass, predict_ids
from pipeline.model.kinds.base import (
    ARTIFACT_KERAS_MODEL,
    ARTIFACT_MODEL_SETTINGS,
    ARTIFACT_TOKENIZER,
    PipelineModel,
)
from pipeline.text import graph_ops
from pipeline.text.conventions import load_labels
from pipeline.text.text_tokenizer import load_text_tokenizer
from pipeline.tracking import CHECKPOINT_ARTIFACTS, CHECKPOINT_LICENCE_TAG, CHECKPOINT_SOURCE_TAG, PRETRAINED_FROM_TAG


def load_keras_model(path: str | Path):
    start_tensorflow_quietly()  # a stage that scores only may load a Keras model: TensorFlow's start-up lines hidden
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


class SentimentClassifier(PipelineModel):
    """The Transformer: a ``.keras`` file and its tokenizer folder (the class name and artifact names are
    those of every Transformer logged so far: their pickles name this class).

    MLflow builds it empty and calls ``load_context`` with the logged artifacts; in the package,
    :meth:`from_paths` builds a loaded one.
    """

    kind: ClassVar[str] = "transformer"
    colour: ClassVar[str] = "tab:blue"
    deploys_as: ClassVar[str] = "a Transformer alone"
    varies_pooling: ClassVar[bool] = True

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

    def explain(self, prepared, steps: int | None = None) -> list[Explanation]:
        return transformer_explanations(self, prepared, steps or IG_STEPS)

    def part_explanations(self, texts: list[str]) -> list[tuple[str, list[Explanation]]]:
        return [("Transformer", self.words(texts))]

    def words(self, texts: list[str]) -> list[Explanation]:
        """Each text's explanation with its words (the text's own row, never its windows)."""
        return transformer_explanations(self, self.text_tokenizer.encode(texts))

    @property
    def transformer_part(self) -> SentimentClassifier:
        return self

    def graph(self, num_classes: int):
        return [self.model], transformer_function(self, num_classes)

    @classmethod
    def card_lines(cls, run, client) -> tuple[list[str], dict[str, str]]:
        return transformer_lines(run.data.params, run.data.tags), run.data.params

    @classmethod
    def cut_note(cls, max_tokens: str | None, windows: bool = False) -> str | None:
        if windows:
            return (
                f"- Reviews longer than {max_tokens} tokens are read whole by the Transformer, as their first and last "
                "tokens and windows of consecutive tokens covering every one, the windows' answers averaged."
            )
        return (
            f"- Reviews longer than {max_tokens} tokens are cut for the Transformer: text in the cut part does not "
            "count."
        )


def class_probabilities(outputs, num_classes: int):
    """``as_class_probabilities`` in-graph: a model that ends in one sigmoid unit gives ``[1 - p, p]``."""
    import tensorflow as tf

    outputs = tf.cast(outputs, tf.float32)
    if num_classes == 2 and outputs.shape[-1] == 1:
        return tf.concat([1.0 - outputs, outputs], axis=1)
    return outputs


def transformer_function(classifier: SentimentClassifier, num_classes: int):
    """Cleaned texts -> float32 ``[N, k]``: ``SentimentClassifier.prepare`` then ``score``, in-graph."""
    text_tokenizer, model = classifier.text_tokenizer, classifier.model
    s = text_tokenizer.settings

    def probabilities(texts):
        tokens = text_tokenizer.tokenizer(texts)
        ids = graph_ops.padded_rows(
            tokens, s.max_sequence_length, s.truncation, s.head_tokens, text_tokenizer.start_id, text_tokenizer.end_id
        )
        rows = class_probabilities(forward_pass(model, ids), num_classes)
        if not classifier.reads_windows:
            return rows
        ids, owner = graph_ops.window_rows(tokens, s.max_sequence_length, text_tokenizer.start_id)
        return graph_ops.pool_windows(rows, class_probabilities(forward_pass(model, ids), num_classes), owner)

    return probabilities


def transformer_lines(params: dict, tags: dict, prefix: str = "") -> list[str]:
    get = params.get
    pretrained = tags.get(PRETRAINED_FROM_TAG)
    if get("model.preset") not in (None, "None"):
        licence = tags.get(CHECKPOINT_LICENCE_TAG, "not recorded")
        return [
            f"- {prefix}Transformer encoder: the pretrained KerasHub preset `{get('model.preset')}`, fine-tuned "
            f"(Keras 3 / KerasHub), **{get('model.pooling')} pooling**, {get('parameters')} parameters.",
            f"- Checkpoint: {tags.get(CHECKPOINT_SOURCE_TAG, 'not recorded')}; licence: **{licence}**. A model "
            f"fine-tuned from it is a derivative of its weights: its licence files are logged with the training "
            f"run (`{CHECKPOINT_ARTIFACTS}/`).",
            f"- Tokenizer: the preset's own, {get('vocabulary_size')} tokens; reviews are cut to "
            f"**{get('tokenizer.max_sequence_length')} tokens** ({get('tokenizer.truncation')} truncation).",
        ]
    return [
        f"- {prefix}Transformer encoder (Keras 3 / KerasHub): {get('model.num_layers')} block(s), width "
        f"{get('model.hidden_dim')}, {get('model.num_heads')} heads, feed-forward {get('model.intermediate_dim')}, "
        f"{get('model.position')} positions, **{get('model.pooling')} pooling**, {get('parameters')} parameters; "
        f"initialisation {get('model.init')}"
        + (f" (masked-LM pretrained backbone from MLflow run `{pretrained}`)" if pretrained else "")
        + (f", token embedding {get('model.token_embedding')}" if get("model.token_embedding") == "word2vec" else "")
        + ".",
        f"- Tokenizer: WordPiece, {get('vocabulary_size')} tokens learned on the training texts; reviews are "
        f"cut to **{get('tokenizer.max_sequence_length')} tokens** ({get('tokenizer.truncation')} truncation)"
        + (
            " for training; a longer review is scored as that row and **windows covering all of it**, their "
            "log-probabilities averaged."
            if get("model.long_reviews") == "windows"
            else "."
        ),
    ]
