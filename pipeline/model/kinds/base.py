"""What every model this pipeline logs is: :class:`PipelineModel`, an MLflow pyfunc model that turns raw texts into
``[N, k]`` class probabilities (``pipeline.core.predictions``) and the scored columns every client writes.

Each kind of model (``pipeline.model.kinds``: the Transformer, NBSVM, their fusion, the TF-IDF reference) subclasses
it in a module of its own and owns what is particular to it: loading its artifacts, ``prepare`` and ``score``, its
explanations, its export graph, its model-card lines, how a comparison shows it. Code outside the kinds asks the model
(``model.explain(...)``, ``model.graph(...)``, ``kind_of(name).deployable``); it never tests a kind's name.

A row that cannot be scored (``pipeline.text.conventions.text_problem``: missing, empty, whitespace-only or not
text) gets an empty probability and label and the reason in ``score_error``, the same answer ``make score``,
``mlflow models predict/serve`` and Spark give.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from pipeline.core.errors import InputError
from pipeline.core.predictions import check_shape, predicted_and_confidence, probability_columns
from pipeline.model.explain import EXPLANATION_COLUMN, TOP_ITEMS, Explanation, explanation_text
from pipeline.text.conventions import text_problem
from pipeline.tracking import MODEL_KIND_TAG

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


class PipelineModel(PythonModel):
    """What every model this pipeline logs answers: a DataFrame ``text`` column of raw strings -> the
    probability columns, ``predicted_label`` and ``score_error``, one row per input row in order.

    A subclass loads its parts (``_load``) and turns texts into ``[N, k]`` probabilities in two steps:
    ``prepare`` (tokenizing, counting n-grams: what batch scoring runs ahead in a reader thread) and
    ``score`` (the model). Unscorable rows never reach either (``pipeline.text.conventions.text_problem``).
    """

    kind: ClassVar[str] = "model"  # the name runs are tagged with (``pipeline.tracking.MODEL_KIND_TAG``)
    colour: ClassVar[str] = "tab:gray"  # its colour in a comparison's plots
    deploys_as: ClassVar[str] = "a model"  # what deploying it means, in the comparison's recommendation
    deployable: ClassVar[bool] = True  # whether a comparison may recommend it (the TF-IDF reference may not)
    suffix: ClassVar[str] = ""  # after a candidate's name in a report (a fusion: " (fused)")
    varies_pooling: ClassVar[bool] = False  # whether its candidates are the pooling question's variants
    labels: list[str]

    @classmethod
    def run_tags(cls) -> dict[str, str]:
        """The tags of a run that holds this kind's model: ``model_kind``, which the loader, the register and the card
        read."""
        return {MODEL_KIND_TAG: cls.kind}

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
        return [explanation_text(explanation.items, top) for explanation in self.explain(prepared)]

    def explain(self, prepared, steps: int | None = None) -> list[Explanation]:
        """One :class:`~pipeline.model.explain.Explanation` per prepared text (``steps``: integrated gradients' steps
        where a Transformer is explained)."""
        raise InputError(f"explanations: no explanation for a {type(self).__name__}")

    def part_explanations(self, texts: list[str]) -> list[tuple[str, list[Explanation]]]:
        """(part name with its weight, one explanation with words per text) for each part that scores (the errors
        page shows them side by side)."""
        raise InputError(f"a {self.kind} model has no word explanations")

    @property
    def transformer_part(self) -> Any:
        """The Transformer inside (itself, a fusion's: a ``SentimentClassifier``), or None."""
        return None

    def graph(self, num_classes: int) -> tuple[list, Any]:
        """(what a TensorFlow export must track, cleaned texts -> ``[N, k]`` float32 tensor) for
        ``pipeline.stages.export``; TensorFlow is imported only when called."""
        raise InputError(f"export: no graph form for a {type(self).__name__}")

    @classmethod
    def card_lines(cls, params: dict[str, str], client) -> tuple[list[str], dict[str, str]]:
        """(lines of the model card's "Model" section, the params of its Transformer or {}) from its run's params;
        ``client`` reads the runs a fusion names."""
        raise InputError(f"no model card for a {cls.kind} model")

    @classmethod
    def cut_note(cls, max_tokens: str | None, windows: bool = False) -> str | None:
        """The card's line on texts longer than the Transformer's token limit (None: no Transformer)."""
        return None

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
