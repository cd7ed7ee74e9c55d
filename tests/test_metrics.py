import numpy as np
import pytest
from sklearn.metrics import accuracy_score, roc_auc_score

from pipeline.metrics import binary_metrics, expected_calibration_error, mcnemar_exact, paired_bootstrap_difference


def two_class(positive: np.ndarray) -> np.ndarray:
    """[N] probabilities of class 1 as the package's [N, 2] shape."""
    return np.column_stack([1.0 - positive, positive])


def test_binary_metrics_agree_with_sklearn():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    probabilities = np.clip(labels * 0.6 + rng.random(500) * 0.4, 0, 1)
    result = binary_metrics(labels, two_class(probabilities))
    assert result["accuracy"] == pytest.approx(accuracy_score(labels, probabilities >= 0.5))
    assert result["roc_auc"] == pytest.approx(roc_auc_score(labels, probabilities))
    assert set(result) == {"accuracy", "precision", "recall", "f1", "roc_auc", "pr_auc", "log_loss", "brier", "ece"}


def test_expected_calibration_error_hand_example():
    # four predictions at confidence 0.9 of which half are right -> |0.5 - 0.9| = 0.4
    labels = np.array([1, 0, 1, 0])
    probabilities = np.array([0.9, 0.9, 0.9, 0.9])
    assert expected_calibration_error(labels, two_class(probabilities)) == pytest.approx(0.4)
    assert expected_calibration_error(np.array([1, 0]), two_class(np.array([1.0, 0.0]))) == pytest.approx(0.0)


def test_mcnemar_known_answer():
    # 10 discordant pairs all favouring A: two-sided exact p = 2 * 0.5**10
    a = np.array([True] * 10 + [True] * 5 + [False] * 5)
    b = np.array([False] * 10 + [True] * 5 + [False] * 5)
    result = mcnemar_exact(a, b)
    assert (result["only_a_correct"], result["only_b_correct"]) == (10, 0)
    assert result["p_value"] == pytest.approx(2 * 0.5**10)
    # balanced disagreements: no evidence of a difference
    assert mcnemar_exact(np.array([True, False] * 5), np.array([False, True] * 5))["p_value"] == pytest.approx(1.0)


def test_mcnemar_rejects_unpaired_input():
    with pytest.raises(ValueError, match="differ in length"):
        mcnemar_exact(np.ones(3, bool), np.ones(4, bool))


def test_paired_bootstrap_known_answers():
    always, never = np.ones((2, 100), bool), np.zeros((2, 100), bool)
    result = paired_bootstrap_difference(always, never, samples=200)
    assert (result["difference"], result["ci_low"], result["ci_high"]) == (1.0, 1.0, 1.0)
    same = paired_bootstrap_difference(always, always, samples=200)
    assert (same["ci_low"], same["ci_high"]) == (0.0, 0.0)
    rng = np.random.default_rng(1)
    a, b = rng.random((3, 2000)) < 0.8, rng.random((3, 2000)) < 0.8
    noisy = paired_bootstrap_difference(a, b, samples=500)
    assert noisy["ci_low"] < noisy["difference"] < noisy["ci_high"]
    assert noisy["difference"] == pytest.approx(a.mean() - b.mean())


def test_multiclass_metrics_hand_example():
    from pipeline.metrics import multiclass_metrics

    labels = np.array([0, 1, 2, 2])
    probabilities = np.array([[0.8, 0.1, 0.1], [0.1, 0.7, 0.2], [0.2, 0.2, 0.6], [0.5, 0.3, 0.2]], dtype=np.float32)
    result = multiclass_metrics(labels, probabilities, ["a", "b", "c"])
    assert result["accuracy"] == pytest.approx(0.75)
    assert result["recall_c"] == pytest.approx(0.5) and result["precision_a"] == pytest.approx(0.5)
    assert result["f1"] == result["macro_f1"] == pytest.approx(np.mean([2 / 3, 1.0, 2 / 3]))
    assert result["log_loss"] == pytest.approx(-np.mean(np.log([0.8, 0.7, 0.6, 0.2])), rel=1e-5)


def test_expected_calibration_error_for_three_classes_uses_top_label_confidence():
    # top-label confidence 0.6 in every row, two of three right -> |2/3 - 0.6|
    labels = np.array([0, 1, 2])
    probabilities = np.array([[0.6, 0.3, 0.1], [0.2, 0.6, 0.2], [0.6, 0.2, 0.2]])
    assert expected_calibration_error(labels, probabilities) == pytest.approx(2 / 3 - 0.6)


def test_accuracy_interval_is_the_wilson_interval():
    from scipy.stats import binomtest

    from pipeline.metrics import accuracy_interval

    correct = np.r_[np.ones(73, bool), np.zeros(27, bool)]
    result = accuracy_interval(correct)
    wilson = binomtest(73, 100).proportion_ci(confidence_level=0.95, method="wilson")
    assert result["rows"] == 100 and result["accuracy"] == pytest.approx(0.73)
    assert (result["ci_low"], result["ci_high"]) == pytest.approx((wilson.low, wilson.high), abs=1e-4)
    assert accuracy_interval(np.ones(5, bool))["ci_high"] == 1.0  # clipped to [0, 1]
    assert np.isnan(accuracy_interval(np.zeros(0, bool))["accuracy"])


def test_accuracy_by_group_keeps_the_order_and_leaves_out_empty_groups():
    from pipeline.metrics import accuracy_by_group

    rows = accuracy_by_group(np.array([1, 0, 1, 1], bool), np.array(["b", "a", "b", "a"]), ["a", "c", "b"])
    assert [(row["bucket"], row["rows"], row["accuracy"]) for row in rows] == [("a", 2, 0.5), ("b", 2, 1.0)]


def test_champion_choice_prefers_crops_among_candidates_close_on_reviews():
    from pipeline.metrics import champion_choice

    val = {"nbsvm": 0.915, "fused": 0.921, "short": 0.919, "crops_only": 0.80}
    crops = {"nbsvm": 0.73, "fused": 0.75, "short": 0.79, "crops_only": 0.85}
    assert champion_choice(val, crops, tolerance=0.003) == "short"  # within 0.3 points, best on crops
    assert champion_choice(val, crops, tolerance=0.0) == "fused"  # the best on reviews alone
    assert champion_choice(val, {}, tolerance=0.003) == "fused"  # no crops: the best on reviews
    assert champion_choice(val, {"nbsvm": 0.9}, tolerance=0.01) == "nbsvm"
    # a candidate without a crop accuracy is never preferred on crops; ties go to reviews, then order
    assert champion_choice({"a": 0.9, "b": 0.9}, {"a": 0.7, "b": 0.7}, 0.0) == "a"
    assert champion_choice({"a": 0.9, "b": 0.91}, {"a": 0.7, "b": 0.7}, 0.02) == "b"


def sklearn_bootstrap(labels, probabilities, samples, seed=0):
    """The model card's intervals as scikit-learn computes them, one call per resample: the reference."""
    from sklearn.metrics import f1_score

    rng, draws = np.random.default_rng(seed), []
    probabilities = probabilities / probabilities.sum(axis=1, keepdims=True)
    binary = probabilities.shape[1] == 2
    for _ in range(samples):
        rows = rng.integers(0, len(labels), len(labels))
        y, p = labels[rows], probabilities[rows]
        hat = p.argmax(axis=1)
        f1 = f1_score(y, hat, zero_division=0) if binary else f1_score(y, hat, average="macro", zero_division=0)
        try:
            auc = (
                roc_auc_score(y, p[:, 1])
                if binary
                else roc_auc_score(y, p, multi_class="ovr", labels=list(range(p.shape[1])))
            )
        except ValueError:
            auc = np.nan
        draws.append((accuracy_score(y, hat), f1, auc))
    draws = np.array(draws)
    return {
        name: {"low": np.nanquantile(draws[:, i], 0.025), "high": np.nanquantile(draws[:, i], 0.975)}
        for i, name in enumerate(("accuracy", "f1", "roc_auc"))
    }


@pytest.mark.parametrize("classes, rows", [(2, 300), (2, 6), (3, 240), (3, 9)])
def test_bootstrap_intervals_are_scikit_learns_on_the_resampled_rows(classes, rows):
    """Counted resamples in NumPy give scikit-learn's figures: ties among the scores (rounded to tenths), resamples
    of a tiny set that hold one class (no ROC AUC) or predict none of a class (macro F1 over the classes present)."""
    from pipeline.metrics import bootstrap_intervals

    rng = np.random.default_rng(classes * rows)
    labels = rng.integers(0, classes, rows)
    logits = rng.normal(size=(rows, classes)) + 1.5 * np.eye(classes)[labels]
    probabilities = np.round(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), 1) + 1e-3
    got = bootstrap_intervals(labels, probabilities, [f"c{i}" for i in range(classes)], samples=230, seed=4)
    expected = sklearn_bootstrap(labels, probabilities, samples=230, seed=4)
    for metric in ("accuracy", "f1", "roc_auc"):
        assert got[metric] == pytest.approx(expected[metric], abs=1e-12), metric
    assert rows < 100 or got["roc_auc"]["low"] < got["roc_auc"]["high"] < 1  # intervals, not points
    with pytest.raises(ValueError, match="3 probability columns for 2 class names"):
        bootstrap_intervals(labels[:3], np.full((3, 3), 1 / 3), ["a", "b"])
