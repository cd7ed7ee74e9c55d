"""A toy kind of model for the tests: one module, as a new kind would be one module under ``pipeline/model/kinds/``.
The more times a text says "good", the likelier positive."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from pipeline.model.explain import Explanation
from pipeline.model.kinds.base import PipelineModel
from pipeline.text.conventions import load_labels


class GoodWordModel(PipelineModel):
    kind: ClassVar[str] = "toy"
    colour: ClassVar[str] = "tab:olive"
    deploys_as: ClassVar[str] = "the toy kind alone"

    @staticmethod
    def artifacts(labels_dir) -> dict[str, str]:
        return {"labels": str(labels_dir)}

    def _load(self, artifacts) -> None:
        self.labels = load_labels(Path(artifacts["labels"]))

    def prepare(self, texts):
        return np.array([text.lower().count("good") for text in texts], dtype=np.float32)

    def score(self, prepared) -> np.ndarray:
        positive = 1.0 / (1.0 + np.exp(-(np.asarray(prepared, dtype=np.float32) - 0.5)))
        return np.stack([1.0 - positive, positive], axis=1).astype(np.float32)

    def explain(self, prepared, steps: int | None = None) -> list[Explanation]:
        return [Explanation({"good": float(count)}, float(count) - 0.5, -0.5) for count in prepared]

    def graph(self, num_classes: int):
        import tensorflow as tf

        def probabilities(texts):
            lowered = tf.strings.lower(texts, encoding="utf-8")
            counts = (
                tf.cast(
                    tf.strings.length(lowered) - tf.strings.length(tf.strings.regex_replace(lowered, "good", "")),
                    tf.float32,
                )
                / 4.0
            )
            positive = tf.sigmoid(counts - 0.5)[:, None]
            return tf.concat([1.0 - positive, positive], axis=1)

        return [], probabilities

    @classmethod
    def card_lines(cls, run, client):
        return [f"- A toy model: it counts the word 'good' ({run.data.params.get('toy.word', '?')})."], {}
