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

    def __init__(self, model=None, labels: Sequence[str] = ()):
        self.model, self.labels = model, list(labels)

    def prepare(self, texts: Sequence[str]):
        return list(texts)

    def score(self, prepared) -> np.ndarray:
        from pipeline.lexical import class_probabilities  # scikit-learn: only where a reference is scored

        return class_probabilities(self.model, prepared, len(self.labels))
