"""The reference kind: a fitted scikit-learn text pipeline held in memory and scored on raw texts (the TF-IDF
reference row of a comparison: evaluated like every candidate, never logged as a model nor deployed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from pipeline.model.kinds.base import PipelineModel


class FittedTextModel(PipelineModel):
    """A fitted scikit-learn text pipeline in memory, scored on raw texts."""

    kind: ClassVar[str] = "reference"
    colour: ClassVar[str] = "tab:gray"
    deploys_as: ClassVar[str] = "a reference row"
    deployable: ClassVar[bool] = False

    @staticmethod
    def run_params(train_rows: int) -> dict[str, object]:
        """The TF-IDF reference's settings as its run logs them (``pipeline.lexical.tfidf_baseline`` builds its model
        from the same constants)."""
        from pipeline.lexical import TFIDF_C, TFIDF_MAX_FEATURES, TFIDF_MIN_DF, TFIDF_NGRAM_RANGE

        low, high = TFIDF_NGRAM_RANGE
        return {
            "model": f"tfidf-{low}-{high}gram+logistic-regression",
            "tfidf.ngram_range": f"{low},{high}",
            "tfidf.min_df": TFIDF_MIN_DF,
            "tfidf.max_features": TFIDF_MAX_FEATURES,
            "tfidf.sublinear_tf": True,
            "logreg.C": TFIDF_C,
            "train_rows": train_rows,
        }

    def __init__(self, model=None, labels: Sequence[str] = ()):
        self.model, self.labels = model, list(labels)

    def prepare(self, texts: Sequence[str]):
        return list(texts)

    def score(self, prepared) -> np.ndarray:
        from pipeline.lexical import class_probabilities  # scikit-learn: only where a reference is scored

        return class_probabilities(self.model, prepared, len(self.labels))
