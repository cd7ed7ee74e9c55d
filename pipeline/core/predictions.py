"""One prediction shape: class probabilities ``[N, k]`` for every class count, two included.

The classifier ends in a ``k``-way softmax for every ``k`` (as KerasHub's ``TextClassifier``
does), so training, metrics and scoring have one loss, one target type and one prediction
rule. A two-class model is not special inside the package; ``positive_probability`` (the
probability of the second label) is a name given only where a result leaves it: scored
tables (:func:`probability_columns`) and reports.

Models logged before this convention end in one sigmoid unit; :func:`as_class_probabilities`
turns their ``[N, 1]`` output into ``[1 - p, p]``, the only place that knows about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

FUSION_EPS = 1e-7  # fuse_probabilities clips each model's probabilities to [FUSION_EPS, 1]: no sure model vetoes
WINDOW_EPS = 1e-12  # pool_windows clips a window's probabilities to [WINDOW_EPS, 1] before their log


def as_class_probabilities(raw) -> np.ndarray:
    """A model's output as float32 ``[N, k]``; a legacy one-unit sigmoid ``p`` becomes ``[1 - p, p]``."""
    probabilities = np.asarray(raw, dtype=np.float32)
    if probabilities.ndim != 2:
        raise ValueError(f"expected class probabilities of shape [N, k], got shape {probabilities.shape}")
    if probabilities.shape[1] == 1:  # saved before every head became a softmax
        return np.concatenate([1.0 - probabilities, probabilities], axis=1)
    return probabilities


def predicted_and_confidence(probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(predicted class index, probability of that class) per row: the arg-max rule.

    For two classes this is the 0.5 threshold on the second class's probability (ties go to
    the first class, as ``argmax`` does; an exact 0.5 is vanishingly rare in float32).
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    predicted = probabilities.argmax(axis=1)
    return predicted, probabilities[np.arange(len(predicted)), predicted]


def check_shape(probabilities: np.ndarray, num_classes: int) -> np.ndarray:
    """``probabilities`` as float64 ``[N, num_classes]``; anything else is an error, never reshaped."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 2 or probabilities.shape[1] != num_classes:
        raise ValueError(f"expected probabilities of shape [N, {num_classes}], got shape {probabilities.shape}")
    return probabilities


def probability_columns(probabilities: np.ndarray, labels: Sequence[str]) -> dict[str, np.ndarray]:
    """Named columns for a table leaving the package.

    Two classes: ``positive_probability`` (the second label's probability); more:
    ``probability_<label>`` for every class.
    """
    probabilities = check_shape(probabilities, len(labels))
    if len(labels) == 2:
        return {"positive_probability": probabilities[:, 1]}
    return {f"probability_{label}": probabilities[:, index] for index, label in enumerate(labels)}


def from_probability_columns(frame, labels: Sequence[str]) -> np.ndarray:
    """The ``[N, k]`` probabilities back from the columns :func:`probability_columns` named."""
    if len(labels) == 2:
        positive = np.asarray(frame["positive_probability"], dtype=np.float64)
        return np.stack([1.0 - positive, positive], axis=1)
    return np.stack([np.asarray(frame[f"probability_{label}"], dtype=np.float64) for label in labels], axis=1)


def prediction_frame(source_files, labels: np.ndarray, probabilities: np.ndarray, names: list[str]) -> pd.DataFrame:
    """The test predictions a stage hands on (``test_predictions.parquet``), one row per test example: label,
    prediction, correctness, confidence and the named probabilities."""
    predicted, confidence = predicted_and_confidence(probabilities)
    return pd.DataFrame(
        {
            "source_file": list(source_files),
            "label": np.asarray(labels),
            "predicted": predicted,
            "correct": predicted == np.asarray(labels),
            "confidence": confidence,
            **probability_columns(probabilities, names),
        }
    )


def fuse_probabilities(transformer: np.ndarray, lexical: np.ndarray, weight) -> np.ndarray:
    """The weighted average of two models' log-probabilities, renormalised: ``weight`` on the Transformer (one
    weight, or one per row: a length-aware fusion gives short texts their own).

    For two classes this is the weighted average of the two logits, ``sigmoid(w * logit(p_t) + (1 - w) *
    logit(p_l))``; probabilities are clipped away from 0 and 1 so a sure model cannot veto the other.
    """
    weights = np.asarray(weight, dtype=np.float64)
    if weights.ndim > 1 or (weights.ndim == 1 and len(weights) != len(transformer)):
        raise ValueError(f"fusion weights: one, or one per row ({len(transformer)}), got shape {weights.shape}")
    if weights.size and not (np.all(weights >= 0.0) and np.all(weights <= 1.0)):
        raise ValueError(f"fusion weight must be in [0, 1], got {weight}")
    weight = weights[:, None] if weights.ndim == 1 else float(weights)
    transformer = np.asarray(np.asarray(transformer, dtype=np.float32), dtype=np.float64)
    lexical = np.asarray(np.asarray(lexical, dtype=np.float32), dtype=np.float64)
    if transformer.shape != lexical.shape:
        raise ValueError(f"cannot fuse probabilities of shapes {transformer.shape} and {lexical.shape}")
    if transformer.shape[1] == 2:  # from the positive class's probability, as scored tables store it
        transformer = np.stack([1.0 - transformer[:, 1], transformer[:, 1]], axis=1)
        lexical = np.stack([1.0 - lexical[:, 1], lexical[:, 1]], axis=1)
    logits = weight * np.log(np.clip(transformer, FUSION_EPS, 1.0)) + (1.0 - weight) * np.log(
        np.clip(lexical, FUSION_EPS, 1.0)
    )
    logits -= logits.max(axis=1, keepdims=True)
    fused = np.exp(logits)
    return (fused / fused.sum(axis=1, keepdims=True)).astype(np.float32)


def lexical_confidence(lexical: np.ndarray) -> np.ndarray:
    """Each row's top-class probability (float64), for two classes from the positive class's probability as scored
    tables store it (so a stored table and a live model give the same number)."""
    probabilities = np.asarray(np.asarray(lexical, dtype=np.float32), dtype=np.float64)
    if probabilities.shape[1] == 2:
        return np.maximum(1.0 - probabilities[:, 1], probabilities[:, 1])
    return probabilities.max(axis=1)


def cascade_threshold(lexical: np.ndarray, share: float) -> float:
    """The confidence at or below which ``share`` of these rows fall (one of their own values, so the rule
    :func:`cascade_rows` gives the same answer in float32 and float64)."""
    return float(np.quantile(lexical_confidence(lexical), share, method="lower"))


def cascade_rows(lexical: np.ndarray, threshold: float | None) -> np.ndarray:
    """Which rows a cascaded fusion reads with its Transformer: those whose lexical confidence is at most
    ``threshold`` (None: every row)."""
    if threshold is None:
        return np.ones(len(lexical), dtype=bool)
    return lexical_confidence(lexical) <= threshold


def cascade_probabilities(fused: np.ndarray, lexical: np.ndarray, routed: np.ndarray) -> np.ndarray:
    """A cascade's answer: the fused probabilities on the ``routed`` rows, the lexical model's on the rest."""
    return np.where(np.asarray(routed)[:, None], np.asarray(fused, np.float32), np.asarray(lexical, np.float32))


@dataclass(frozen=True)
class FusionRule:
    """How a fused model (a Transformer and NBSVM) answers, written once: the pyfunc model
    (``pipeline.model.kinds.fusion_classifier``), its explanations, its export graph and the comparison's evaluation
    follow it.

    Each text's Transformer weight is ``weight``, or ``short_weight`` for texts of at most ``short_max_words`` words (0:
    one weight). Without a cascade every text gets :func:`fuse_probabilities` of the two parts. A cascade
    (``cascade_threshold``) routes to the Transformer only the texts whose NBSVM confidence is at most the threshold
    (:func:`cascade_rows`); they get the fusion, every other text NBSVM's own probabilities, whatever the weights. A
    part that cannot change an answer is not run: the Transformer when every weight is 0; NBSVM when every weight is 1
    and there is no cascade (a cascade needs NBSVM to route, even at weight 1).
    """

    weight: float
    short_weight: float
    short_max_words: int = 0
    cascade_threshold: float | None = None

    def __post_init__(self) -> None:
        for name in ("weight", "short_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"fusion {name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def runs_transformer(self) -> bool:
        return max(self.weight, self.short_weight) > 0

    @property
    def runs_lexical(self) -> bool:
        return min(self.weight, self.short_weight) < 1 or self.cascade_threshold is not None

    def row_weights(self, count: int, words: np.ndarray | None = None) -> np.ndarray:
        """Each of ``count`` texts' Transformer weight; ``words`` (their word counts) is read only with a limit."""
        if not self.short_max_words or words is None:
            return np.full(count, self.weight)
        return np.where(np.asarray(words) <= self.short_max_words, self.short_weight, self.weight)

    def reads(self, lexical: np.ndarray) -> np.ndarray:
        """Whether the Transformer reads each row: the rows whose NBSVM confidence is at most the cascade's threshold
        (:func:`cascade_rows`), every row without a cascade."""
        return cascade_rows(lexical, self.cascade_threshold)

    def routed(self, lexical: np.ndarray | None) -> np.ndarray | None:
        """The rows (indices, in order) the Transformer reads; None: every row (no cascade)."""
        if self.cascade_threshold is None:
            return None
        if lexical is None:
            raise ValueError("a cascade routes on NBSVM's probabilities: none were given")
        return np.flatnonzero(self.reads(lexical))

    def answer(
        self,
        transformer: np.ndarray | None,
        lexical: np.ndarray | None,
        weights: np.ndarray,
        routed: np.ndarray | None,
    ) -> np.ndarray:
        """The fused ``[N, k]`` answer from the parts: ``transformer`` on the ``routed`` rows (every row when None),
        None when it is not run; ``lexical`` on every row, None when it is not run; ``weights`` per row."""
        weights = np.asarray(weights, dtype=np.float64)
        if routed is None:  # one part alone is fused with itself
            if transformer is not None:
                return fuse_probabilities(transformer, lexical if lexical is not None else transformer, weights)
            if lexical is not None:
                return fuse_probabilities(lexical, lexical, weights)
            raise ValueError("a fused model scored neither part")
        if lexical is None:
            raise ValueError("a cascade answers with NBSVM's probabilities off its routed rows: none were given")
        answer = np.array(lexical, dtype=np.float32)
        if len(routed):
            part = answer[routed]
            answer[routed] = fuse_probabilities(transformer if transformer is not None else part, part, weights[routed])
        return answer


def pool_windows(probabilities: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """``[texts, k]`` from the ``[rows, k]`` probabilities of every text's rows
    (``WordPieceTextTokenizer.encode_windows``: each text's own row first, in order, then its windows; ``owner`` the
    text of each row): the softmax of the mean log-probability over a text's rows (for two classes, the mean logit); a
    text of one row keeps that row's."""
    probabilities, owner = np.asarray(probabilities), np.asarray(owner, dtype=np.int64)
    texts = int(owner.max()) + 1 if len(owner) else 0
    pooled = probabilities[:texts].copy()
    counts = np.bincount(owner, minlength=texts)
    many = counts > 1
    if many.any():
        sums = np.zeros((texts, probabilities.shape[1]))
        np.add.at(sums, owner, np.log(np.clip(probabilities.astype(np.float64), WINDOW_EPS, 1.0)))
        mean = sums[many] / counts[many, None]
        exp = np.exp(mean - mean.max(axis=1, keepdims=True))
        pooled[many] = exp / exp.sum(axis=1, keepdims=True)
    return pooled
