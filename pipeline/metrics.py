"""Pure evaluation and comparison statistics (no files, no MLflow).

Classification metrics come from scikit-learn; expected calibration error, the paired
bootstrap (paired differences and percentile intervals) and McNemar's exact test are the few pieces
scikit-learn does not provide.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binomtest
from sklearn import metrics as skm

from pipeline.core.predictions import fuse_probabilities, predicted_and_confidence


def first_half(rows: int, seed: int = 0) -> np.ndarray:
    """The random half of ``rows`` validation rows that cross-fitting chooses on (and scores the other half with): the
    same half for every choice made with one ``seed``."""
    first = np.zeros(rows, dtype=bool)
    first[np.random.default_rng(seed).permutation(rows)[: rows // 2]] = True
    return first


def cross_fitted_correct(correct: dict, seed: int = 0) -> np.ndarray:
    """Per row, whether the option chosen on the *other* half of the rows gets it right: the rows behind
    :func:`cross_fitted_accuracy` (a random half, ``seed``; ties go to the option listed first).

    ``correct``: option -> boolean array, one entry per validation row (the same rows for every option).
    """
    options = list(correct)
    first = first_half(len(correct[options[0]]), seed)

    def chosen_on(mask: np.ndarray):
        return max(options, key=lambda option: np.asarray(correct[option])[mask].mean())

    return np.where(first, np.asarray(correct[chosen_on(~first)]), np.asarray(correct[chosen_on(first)])).astype(bool)


def cross_fitted_accuracy(correct: dict, seed: int = 0) -> float:
    """The validation accuracy of *choosing* among options (a regularisation strength, a fusion weight) on the
    same validation rows, estimated without the optimism of choosing and scoring on one set: the option with
    the best accuracy on one half of the rows is scored on the other half, both ways, and the two averaged
    (:func:`cross_fitted_correct`).
    """
    right = cross_fitted_correct(correct, seed)
    return float(right.sum() / len(right))


def expected_calibration_error(labels: np.ndarray, probabilities: np.ndarray, bins: int = 15) -> float:
    """Weighted mean |accuracy - confidence| over equal-width bins of the predicted class's probability.

    ``probabilities`` is ``[N, k]``; the bins span ``[1/k, 1]``, the range a top-label
    confidence can take (``[0.5, 1]`` for two classes).
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    predicted, confidence = predicted_and_confidence(probabilities)
    correct = (predicted == np.asarray(labels)).astype(np.float64)
    edges = np.linspace(1.0 / probabilities.shape[1], 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    error = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            error += in_bin.mean() * abs(correct[in_bin].mean() - confidence[in_bin].mean())
    return float(error)


def _normalised(probabilities: np.ndarray) -> np.ndarray:
    """float64 rows that sum to 1 (float32 softmax sums drift from 1 in the last digits)."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    return probabilities / probabilities.sum(axis=1, keepdims=True)


def binary_metrics(labels: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """Accuracy, precision, recall, F1, ROC AUC, PR AUC, log loss, Brier score and ECE; class 1 is positive."""
    labels = np.asarray(labels).astype(int)
    probabilities = _normalised(probabilities)
    positive = np.clip(probabilities[:, 1], 1e-7, 1 - 1e-7)
    predictions, _ = predicted_and_confidence(probabilities)
    both_classes = len(np.unique(labels)) == 2
    return {
        "accuracy": float(skm.accuracy_score(labels, predictions)),
        "precision": float(skm.precision_score(labels, predictions, zero_division=0)),
        "recall": float(skm.recall_score(labels, predictions, zero_division=0)),
        "f1": float(skm.f1_score(labels, predictions, zero_division=0)),
        "roc_auc": float(skm.roc_auc_score(labels, positive)) if both_classes else float("nan"),
        "pr_auc": float(skm.average_precision_score(labels, positive)) if both_classes else float("nan"),
        "log_loss": float(skm.log_loss(labels, positive, labels=[0, 1])),
        "brier": float(skm.brier_score_loss(labels, positive)),
        "ece": expected_calibration_error(labels, probabilities),
    }


def multiclass_metrics(labels: np.ndarray, probabilities: np.ndarray, names: list[str]) -> dict[str, float]:
    """Accuracy, macro/weighted F1 (``f1`` is macro), one-vs-rest ROC AUC, log loss, ECE, per-class P/R/F1."""
    labels = np.asarray(labels).astype(int)
    probabilities = _normalised(probabilities)
    classes = list(range(len(names)))
    predictions, _ = predicted_and_confidence(probabilities)
    present = np.unique(labels)
    result = {
        "accuracy": float(skm.accuracy_score(labels, predictions)),
        "f1": float(skm.f1_score(labels, predictions, average="macro", labels=classes, zero_division=0)),
        "macro_f1": float(skm.f1_score(labels, predictions, average="macro", labels=classes, zero_division=0)),
        "weighted_f1": float(skm.f1_score(labels, predictions, average="weighted", labels=classes, zero_division=0)),
        "roc_auc": (
            float(skm.roc_auc_score(labels, probabilities, multi_class="ovr", labels=classes))
            if len(present) == len(classes)
            else float("nan")
        ),
        "log_loss": float(skm.log_loss(labels, probabilities, labels=classes)),
        "ece": expected_calibration_error(labels, probabilities),
    }
    precision, recall, f1, _ = skm.precision_recall_fscore_support(labels, predictions, labels=classes, zero_division=0)
    for index, name in enumerate(names):
        result[f"precision_{name}"] = float(precision[index])
        result[f"recall_{name}"] = float(recall[index])
        result[f"f1_{name}"] = float(f1[index])
    return result


def classification_metrics(labels: np.ndarray, probabilities: np.ndarray, names: list[str]) -> dict[str, float]:
    """The binary report (positive = the second class) for two classes, else the multi-class one."""
    if len(names) == 2:
        return binary_metrics(labels, probabilities)
    return multiclass_metrics(labels, probabilities, names)


def mcnemar_exact(correct_a: np.ndarray, correct_b: np.ndarray) -> dict[str, float]:
    """McNemar's exact test on paired per-example correctness of two models.

    ``b`` counts examples only A got right, ``c`` those only B got right; under the null
    hypothesis of equal error rates the discordant pairs split 50/50 (two-sided binomial).
    """
    correct_a, correct_b = np.asarray(correct_a, bool), np.asarray(correct_b, bool)
    if correct_a.shape != correct_b.shape:
        raise ValueError(f"paired predictions differ in length: {correct_a.shape} vs {correct_b.shape}")
    b = int((correct_a & ~correct_b).sum())
    c = int((~correct_a & correct_b).sum())
    p_value = 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5, alternative="two-sided").pvalue)
    return {"only_a_correct": b, "only_b_correct": c, "p_value": p_value}


def paired_bootstrap_difference(
    correct_a: np.ndarray, correct_b: np.ndarray, samples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> dict[str, float]:
    """Bootstrap CI of accuracy(A) - accuracy(B), resampling test examples with both models paired.

    ``correct_a``/``correct_b`` are ``[seeds, examples]`` (or ``[examples]``) booleans; each
    resample draws the same example indices for every seed and both models and takes the
    mean difference over seeds.
    """
    a = np.atleast_2d(np.asarray(correct_a, dtype=np.float64))
    b = np.atleast_2d(np.asarray(correct_b, dtype=np.float64))
    if a.shape != b.shape:
        raise ValueError(f"paired predictions differ in shape: {a.shape} vs {b.shape}")
    per_example = (a - b).mean(axis=0)  # seed-averaged difference per test example
    rng = np.random.default_rng(seed)
    n = per_example.shape[0]
    draws = np.empty(samples)
    for i in range(samples):
        draws[i] = per_example[rng.integers(0, n, n)].mean()
    tail = (1.0 - confidence) / 2
    return {
        "difference": float(per_example.mean()),
        "ci_low": float(np.quantile(draws, tail)),
        "ci_high": float(np.quantile(draws, 1 - tail)),
        "samples": samples,
    }


def _weighted_auc(scores: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """ROC AUC of ``scores`` for ``positive`` (bool) under each row of ``weights`` (``[draws, N]``: how often each
    example is in a resample): the Mann-Whitney statistic with ties counted half, which is what scikit-learn's
    ``roc_auc_score`` gives on the resampled rows. NaN for a draw without both classes."""
    order = np.argsort(scores, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(scores[order]) != 0])  # groups of equal scores
    sorted_weights = weights[:, order]
    pos = np.add.reduceat(sorted_weights * positive[order], starts, axis=1)
    neg = np.add.reduceat(sorted_weights * ~positive[order], starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg  # negatives scored lower than each group
    pairs = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, (pos * (below + 0.5 * neg)).sum(axis=1) / pairs, np.nan)


def _resampled_scores(labels: np.ndarray, probabilities: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``[draws, 3]``: accuracy, F1 and ROC AUC of each resample (``weights``: counts per example), as scikit-learn
    gives them on the resampled rows: of the positive class for two classes; for more, F1 macro-averaged over the
    classes the resample holds or predicts (``f1_score``'s default labels) and ROC AUC one-vs-rest over all."""
    classes = probabilities.shape[1]
    predicted = probabilities.argmax(axis=1)
    total = weights.sum(axis=1)
    accuracy = weights @ (predicted == labels) / total
    f1_rows: list[np.ndarray] = []
    auc: list[np.ndarray] = []
    for target in [1] if classes == 2 else range(classes):
        true, hat = labels == target, predicted == target
        hits, misses = weights @ (true & hat), weights @ (true ^ hat)  # true positives; false ones of both kinds
        with np.errstate(invalid="ignore", divide="ignore"):
            f1_rows.append(np.where(2 * hits + misses > 0, 2 * hits / (2 * hits + misses), np.nan))
        auc.append(_weighted_auc(probabilities[:, target], true, weights))
    f1 = np.stack(f1_rows)
    f1 = np.nan_to_num(f1[0]) if classes == 2 else np.nanmean(f1, axis=0)  # an absent class: 0, or not counted
    return np.stack([accuracy, f1, np.mean(auc, axis=0)], axis=1)  # a class absent: NaN, as scikit-learn refuses


def bootstrap_intervals(
    labels: np.ndarray,
    probabilities: np.ndarray,
    names: list[str],
    samples: int = 500,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, dict[str, float]]:
    """Percentile bootstrap CIs (test examples resampled) of accuracy, F1 and ROC AUC.

    F1 and ROC AUC as in :func:`classification_metrics`: of the positive class for two classes,
    macro-averaged (ROC AUC one-vs-rest) for more. Returns ``{metric: {"low", "high"}}``. Each resample is a
    row of counts (how often each example was drawn), and the metrics of 100 resamples at a time are computed
    from those counts in NumPy: the same figures as scikit-learn on the resampled rows, without a call per resample.
    """
    labels = np.asarray(labels)
    probabilities = _normalised(probabilities)
    if probabilities.shape[1] != len(names):
        raise ValueError(f"{probabilities.shape[1]} probability columns for {len(names)} class names")
    rng, rows = np.random.default_rng(seed), len(labels)
    batches: list[np.ndarray] = []
    for first in range(0, samples, 100):
        counts = np.stack(
            [np.bincount(rng.integers(0, rows, rows), minlength=rows) for _ in range(min(100, samples - first))]
        ).astype(np.float64)
        batches.append(_resampled_scores(labels, probabilities, counts))
    draws = np.concatenate(batches)
    tail = (1.0 - confidence) / 2
    return {
        name: {"low": float(np.nanquantile(draws[:, i], tail)), "high": float(np.nanquantile(draws[:, i], 1 - tail))}
        for i, name in enumerate(("accuracy", "f1", "roc_auc"))
    }


# --------------------------------------------------------------------------- comparing two models

SIGNIFICANCE_LEVEL = 0.05


def compare_pair(correct_a: np.ndarray, correct_b: np.ndarray, labels: list[dict], samples: int) -> dict:
    """Accuracy difference A - B over matched rows (one per seed, or per seed and other-factor level):
    a McNemar test per matched pair and a paired bootstrap CI of the mean difference."""
    per_pair = [
        {**label, **mcnemar_exact(a, b), "accuracy_difference": float(a.mean() - b.mean())}
        for label, a, b in zip(labels, correct_a, correct_b)
    ]
    bootstrap = paired_bootstrap_difference(correct_a, correct_b, samples=samples, seed=0)
    ci_excludes_zero = bootstrap["ci_low"] > 0 or bootstrap["ci_high"] < 0
    all_pairs_significant = all(s["p_value"] < SIGNIFICANCE_LEVEL for s in per_pair)
    same_sign = len({np.sign(s["accuracy_difference"]) for s in per_pair}) == 1
    return {
        "mean_accuracy_difference": bootstrap["difference"],
        "bootstrap": bootstrap,
        "mcnemar": per_pair,
        "significant": bool(ci_excludes_zero and all_pairs_significant and same_sign),
        "criterion": (
            f"significant when the paired bootstrap {int(100 * 0.95)}% CI excludes 0, every seed-matched "
            f"McNemar test has p < {SIGNIFICANCE_LEVEL}, and all pairs agree on the sign"
        ),
    }


def best_fusion_weight(
    val_transformer: np.ndarray, val_lexical: np.ndarray, val_labels: np.ndarray, steps: int
) -> tuple[float, dict[float, float], float]:
    """The Transformer's weight in the fusion with the best validation accuracy (ties: lower log loss).

    Returns the weight, the validation accuracy of every weight tried (0, 1/(steps-1), ..., 1), and the
    cross-fitted validation accuracy of choosing the weight this way (``metrics.cross_fitted_accuracy``):
    the best of 21 weights on the rows it is scored on flatters the fusion, the cross-fitted one does not.
    """
    best, by_weight, correct = fusion_weight_scan(val_transformer, val_lexical, val_labels, steps)
    return best, by_weight, cross_fitted_accuracy(correct)


def fusion_weight_scan(
    val_transformer: np.ndarray, val_lexical: np.ndarray, val_labels: np.ndarray, steps: int
) -> tuple[float, dict[float, float], dict[float, np.ndarray]]:
    """:func:`best_fusion_weight`'s weight and accuracies, with each weight's per-row correctness (for
    :func:`cross_fitted_correct`)."""
    scores, correct = {}, {}
    for weight in np.linspace(0.0, 1.0, steps):
        fused = fuse_probabilities(val_transformer, val_lexical, float(weight))
        key = round(float(weight), 4)
        correct[key] = fused.argmax(axis=1) == val_labels
        log_loss = float(-np.log(np.clip(fused[np.arange(len(val_labels)), val_labels], 1e-7, 1.0)).mean())
        scores[key] = (float(correct[key].mean()), -log_loss)
    best = max(scores, key=lambda w: scores[w])
    return best, {w: s[0] for w, s in scores.items()}, correct


def cross_fitted_fusion(
    transformer: np.ndarray, lexical: np.ndarray, labels: np.ndarray, groups: np.ndarray, steps: int, seed: int = 0
) -> tuple[float, np.ndarray]:
    """The fusion weight chosen on all rows (:func:`best_fusion_weight`), and every row's probabilities fused with the
    weight chosen on the other half of the rows: an honest validation figure for a weight chosen on these rows.
    Halves hold whole ``groups`` (the review a sentence crop was cut from goes with the crop); at least two groups."""
    groups = np.asarray(groups)
    unique = np.unique(groups)
    if len(unique) < 2:
        raise ValueError("cross-fitting a fusion weight needs rows of two or more groups")
    first = np.isin(groups, np.random.default_rng(seed).permutation(unique)[: len(unique) // 2])
    fused = np.zeros(transformer.shape, dtype=np.float32)
    for chosen_on in (first, ~first):
        weight = best_fusion_weight(transformer[chosen_on], lexical[chosen_on], labels[chosen_on], steps)[0]
        fused[~chosen_on] = fuse_probabilities(transformer[~chosen_on], lexical[~chosen_on], weight)
    return best_fusion_weight(transformer, lexical, labels, steps)[0], fused


def accuracy_interval(correct: np.ndarray, z: float = 1.96) -> dict[str, float]:
    """Accuracy of ``correct`` (booleans, or each row's share of correct runs over seeds) with its Wilson score
    interval (95 % for ``z`` = 1.96): ``rows``, ``accuracy``, ``ci_low``, ``ci_high``. For a mean over seeds the
    interval treats each row as one trial, which overstates its width (a row right in some seeds varies less
    than a coin). An empty array has accuracy NaN."""
    correct = np.asarray(correct, dtype=np.float64)
    rows = len(correct)
    if not rows:
        return {"rows": 0, "accuracy": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    accuracy = float(correct.mean())
    scale = 1.0 + z * z / rows
    centre = (accuracy + z * z / (2 * rows)) / scale
    half = z * np.sqrt(accuracy * (1.0 - accuracy) / rows + z * z / (4 * rows * rows)) / scale
    # the interval always holds the accuracy; min/max only undo rounding at 0 and 1
    return {
        "rows": rows,
        "accuracy": accuracy,
        "ci_low": float(max(0.0, min(centre - half, accuracy))),
        "ci_high": float(min(1.0, max(centre + half, accuracy))),
    }


def accuracy_by_group(correct: np.ndarray, groups: np.ndarray, order: list[str]) -> list[dict]:
    """:func:`accuracy_interval` per group in ``order`` (``bucket`` names the group); groups without rows are left
    out."""
    correct, groups = np.asarray(correct, dtype=np.float64), np.asarray(groups)
    return [{"bucket": name, **accuracy_interval(correct[groups == name])} for name in order if (groups == name).any()]


def champion_choice(val_accuracy: dict[str, float], crop_accuracy: dict[str, float], tolerance: float) -> str:
    """The stated rule for the model to deploy, from validation only: of the candidates whose full-review validation
    accuracy is within ``tolerance`` of the best, the one with the best accuracy on the validation sentence crops
    (ties: the better full-review accuracy, then the first listed). A candidate without a crop accuracy (evaluated
    before crops existed) is never preferred on crops; without any, the best full-review accuracy wins."""
    best = max(val_accuracy.values())
    eligible = [name for name, accuracy in val_accuracy.items() if accuracy >= best - tolerance - 1e-12]
    return max(eligible, key=lambda name: (crop_accuracy.get(name, float("-inf")), val_accuracy[name]))
