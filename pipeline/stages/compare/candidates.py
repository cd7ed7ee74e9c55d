"""The candidates of a comparison: the :class:`Candidate` every kind becomes and the table of kinds.

A candidate is one model (or, for the TF-IDF reference row, one fitted baseline) with its MLflow run, its test and
validation predictions (``pipeline.core.predictions.prediction_frame``), its sentence crops' predictions and the
metrics a comparison reports. Its kind is one of the model kinds (``pipeline.model.kinds.KINDS``): ``transformer``
(one variant and seed), ``nbsvm``, ``fusion`` (a Transformer run fused with NBSVM) and ``reference`` (TF-IDF, not
deployable); the kind's class says how it is shown and whether it may be deployed. Producers
(``producers.py``) compute them; one recorder (``recorder.py``) logs, evaluates and reports every kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.model.kinds import KINDS
from pipeline.stages.evaluate import behaviour
from pipeline.tracking import selection_accuracy

SELECTION = "selection_val_accuracy"  # what a candidate is chosen by (``pipeline.tracking.selection_accuracy``)
SUMMARY_METRICS = ("test_accuracy", "test_f1", "test_roc_auc", "test_log_loss", "test_ece", SELECTION, "train_seconds")
CROP_METRICS = ("val_crop_accuracy", "test_crop_accuracy")  # the sentence crops (``evaluate.lengths``)
NBSVM, TFIDF = "nbsvm", "tfidf"


LABELS = {NBSVM: "NBSVM (1-3-gram naive-Bayes logistic regression)", TFIDF: "TF-IDF + logistic regression (reference)"}


@dataclass(frozen=True)
class Candidate:
    """One candidate run: ``name`` is its row in the report (``first_token``, ``nbsvm``, ``nbsvm+mean``, ...)."""

    name: str
    kind: str
    seed: int | None
    run_id: str
    metrics: dict[str, float]
    predictions: pd.DataFrame  # test rows
    val_predictions: pd.DataFrame | None = None  # validation rows (the reference row has none)
    folder: Path | None = None  # a Transformer's run folder; NBSVM's model folder
    settings: dict[str, str] = field(default_factory=dict)  # a Transformer's design settings (fused runs log them)
    max_tokens: int | None = None  # a Transformer's token limit
    crops: pd.DataFrame | None = None  # its predictions on the sentence crops (the reference has none)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind of candidate {self.kind!r} (known: {', '.join(KINDS)})")

    @property
    def correct(self) -> np.ndarray:
        """Whether each test row was predicted right, in the test split's order."""
        return self.predictions["correct"].to_numpy(dtype=bool)

    def crop_predictions(self) -> pd.DataFrame:
        """:attr:`crops`; an error for a candidate evaluated without them (the reference)."""
        if self.crops is None:
            raise ValueError(f"candidate {self.name} (run {self.run_id}) has no predictions on the sentence crops")
        return self.crops

    def run_folder(self) -> Path:
        """:attr:`folder`; an error for a candidate without one."""
        if self.folder is None:
            raise ValueError(f"candidate {self.name} (run {self.run_id}) has no run folder")
        return self.folder


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a comparison reports: ``SUMMARY_METRICS``, ``CROP_METRICS`` and the behaviour pass rates."""
    chosen_by = selection_accuracy(metrics)
    return {
        **{k: v for k, v in metrics.items() if k in SUMMARY_METRICS or k in CROP_METRICS or behaviour.capability_of(k)},
        **({SELECTION: chosen_by} if chosen_by is not None else {}),
    }


def fused_name(name: str) -> str:
    return f"{NBSVM}+{name}"
