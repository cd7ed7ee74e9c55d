"""A fused candidate's weights: one, or one for short texts and one for the rest, with honest validation figures."""

import dataclasses

import numpy as np
import pytest

from pipeline.core.predictions import cascade_rows, cascade_threshold, fuse_probabilities, lexical_confidence
from pipeline.metrics import cross_fitted_fusion, first_half
from pipeline.stages.compare import fusion_weights
from pipeline.stages.compare.fusion_weights import (
    EvaluatedRows,
    PartScores,
    cascade,
    cascade_shares,
    choose_cascade,
    choose_fusion,
)


def probabilities(labels, right: np.ndarray, rng, sure: float = 0.8) -> np.ndarray:
    """Two-class probabilities that are right (on the label's side) where ``right``, wrong elsewhere."""
    positive = np.where(
        right == (labels == 1), rng.uniform(0.55, sure, len(labels)), rng.uniform(1 - sure, 0.45, len(labels))
    )
    return np.stack([1 - positive, positive], axis=1)


def synthetic(seed: int = 0, rows: int = 400, crops: int = 400):
    """A Transformer that is right on long texts and NBSVM on short ones (both 60/40 on the other kind)."""
    rng = np.random.default_rng(seed)
    val_words, test_words = rng.integers(5, 300, rows), rng.integers(5, 300, rows)
    crop_words = {"val": rng.integers(3, 60, crops), "test": rng.integers(3, 60, crops)}
    labels = {
        "val": rng.integers(0, 2, rows),
        "test": rng.integers(0, 2, rows),
        "crops_val": rng.integers(0, 2, crops),
        "crops_test": rng.integers(0, 2, crops),
    }

    def part(good_on_long: bool):
        def scores(words, y):
            long = words > 80
            right = np.where(long == good_on_long, rng.random(len(y)) < 0.95, rng.random(len(y)) < 0.6)
            return probabilities(y, right, rng)

        return PartScores(
            scores(val_words, labels["val"]),
            scores(test_words, labels["test"]),
            {
                "val": scores(crop_words["val"], labels["crops_val"]),
                "test": scores(crop_words["test"], labels["crops_test"]),
            },
        )

    rows_ = EvaluatedRows(
        labels["val"], val_words, test_words, crop_words, labels["crops_val"], rng.integers(0, rows, crops)
    )
    return part(True), part(False), rows_, labels


def test_one_weight_without_a_limit_is_todays_fusion():
    transformer, lexical, rows, _ = synthetic()
    choice = choose_fusion(transformer, lexical, rows, steps=21)
    assert choice.short_max_words == 0 and choice.short_weight == choice.weight
    np.testing.assert_allclose(choice.test, fuse_probabilities(transformer.test, lexical.test, choice.weight))


def test_short_texts_get_their_own_weight_and_the_test_rows_theirs_by_length():
    transformer, lexical, rows, labels = synthetic()
    one = choose_fusion(transformer, lexical, rows, steps=21)
    two = choose_fusion(transformer, lexical, rows, steps=21, short_max_words=80)
    assert two.short_max_words == 80 and two.weight > 0.5 > two.short_weight  # each text to the part right on it
    short = rows.test_words <= 80
    np.testing.assert_allclose(
        two.test[short], fuse_probabilities(transformer.test[short], lexical.test[short], two.short_weight)
    )
    np.testing.assert_allclose(
        two.test[~short], fuse_probabilities(transformer.test[~short], lexical.test[~short], two.weight)
    )
    accuracy = {
        name: (choice.crops["test"].argmax(1) == labels["crops_test"]).mean()
        for name, choice in (("one", one), ("two", two))
    }
    assert accuracy["two"] > accuracy["one"] + 0.1


def test_the_validation_figures_of_short_texts_are_cross_fitted_not_scored_where_chosen():
    transformer, lexical, rows, labels = synthetic()
    two = choose_fusion(transformer, lexical, rows, steps=21, short_max_words=80)
    short_crops = rows.crop_words["val"] <= 80
    in_sample = fuse_probabilities(
        transformer.crops["val"][short_crops], lexical.crops["val"][short_crops], two.short_weight
    )
    assert not np.allclose(two.crops["val"][short_crops], in_sample)  # the other half's weight, not the chosen one
    long = rows.val_words > 80
    np.testing.assert_allclose(two.val[long], fuse_probabilities(transformer.val[long], lexical.val[long], two.weight))
    assert 0.5 < two.honest < 1.0


def test_too_few_short_texts_fall_back_to_one_weight(monkeypatch):
    transformer, lexical, rows, _ = synthetic(rows=400, crops=400)
    monkeypatch.setattr(fusion_weights, "MIN_ROWS", 10_000)
    assert choose_fusion(transformer, lexical, rows, steps=21, short_max_words=80).short_max_words == 0


def test_cross_fitting_keeps_a_crop_with_its_review():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 200)
    t, x = probabilities(labels, rng.random(200) < 0.9, rng), probabilities(labels, rng.random(200) < 0.6, rng)
    groups = np.repeat(np.arange(100), 2)
    weight, fused = cross_fitted_fusion(t, x, labels, groups, steps=11)
    assert weight == 1.0 and fused.shape == t.shape
    with pytest.raises(ValueError, match="two or more groups"):
        cross_fitted_fusion(t, x, labels, np.zeros(200), steps=11)


def test_per_row_weights_fuse_each_row_with_its_own():
    t = np.array([[0.2, 0.8], [0.6, 0.4]])
    x = np.array([[0.7, 0.3], [0.1, 0.9]])
    both = fuse_probabilities(t, x, np.array([0.25, 0.9]))
    np.testing.assert_allclose(both[0], fuse_probabilities(t[:1], x[:1], 0.25)[0])
    np.testing.assert_allclose(both[1], fuse_probabilities(t[1:], x[1:], 0.9)[0])
    with pytest.raises(ValueError, match="one per row"):
        fuse_probabilities(t, x, np.array([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fuse_probabilities(t, x, np.array([0.5, 1.5]))


@pytest.mark.parametrize("short_max_words", [0, 80])
def test_a_cascade_keeps_nbsvms_answer_where_it_is_sure_and_the_fusions_elsewhere(short_max_words):
    transformer, lexical, rows, labels = synthetic()
    choice = choose_fusion(transformer, lexical, rows, steps=21, short_max_words=short_max_words)
    cascaded = cascade(choice, lexical, rows, share=0.3)
    confidence = lexical_confidence(lexical.val)
    assert cascaded.threshold in confidence and cascaded.routed["val"] == pytest.approx(0.3, abs=0.01)
    for name, fused, part in (
        ("val", choice.val, lexical.val),
        ("test", choice.test, lexical.test),
        ("crops_test", choice.crops["test"], lexical.crops["test"]),
    ):
        got = {"val": cascaded.choice.val, "test": cascaded.choice.test}.get(name, cascaded.choice.crops["test"])
        routed = lexical_confidence(part) <= cascaded.threshold
        np.testing.assert_array_equal(got[routed], fused[routed].astype(np.float32))
        np.testing.assert_array_equal(got[~routed], part[~routed].astype(np.float32))
        assert cascaded.routed[name] == routed.mean()
    # the honest figure: the fusion's cross-fitted rows where the Transformer reads, NBSVM's own answer elsewhere
    routed = lexical_confidence(lexical.val) <= cascaded.threshold
    nbsvm_right = lexical.val.argmax(axis=1) == labels["val"]
    assert cascaded.choice.honest == np.where(routed, choice.honest_rows, nbsvm_right).mean()
    assert choice.honest_rows.mean() == pytest.approx(choice.honest)
    assert cascaded.choice.weight == choice.weight and cascaded.choice.short_weight == choice.short_weight


def test_a_cascade_of_every_text_is_the_fusion_and_the_rule_reads_the_positive_probability():
    transformer, lexical, rows, _ = synthetic()
    choice = choose_fusion(transformer, lexical, rows, steps=21)
    whole = cascade(choice, lexical, rows, share=1.0)
    # share 1: the threshold is the most sure validation row's confidence, so every validation row is read, and a test
    # row only when NBSVM is no surer of it than of any validation row
    assert whole.threshold == lexical_confidence(lexical.val).max() and whole.routed["val"] == 1.0
    assert whole.routed["test"] == (lexical_confidence(lexical.test) <= whole.threshold).mean()
    np.testing.assert_array_equal(whole.choice.val, choice.val.astype(np.float32))
    assert whole.choice.honest == choice.honest
    # two classes: the confidence is read from the positive class's probability, as a scored table stores it
    stored = np.array([[0.0, 0.9], [0.0, 0.2], [0.0, 0.55]], dtype=np.float32)
    live = np.array([[0.1, 0.9], [0.8, 0.2], [0.45, 0.55]], dtype=np.float32)
    np.testing.assert_array_equal(cascade_rows(stored, 0.8), cascade_rows(live, 0.8))
    assert cascade_rows(live, 0.8).tolist() == [False, True, True] and cascade_rows(live, None).all()
    assert cascade_threshold(live, 0.5) == pytest.approx(0.8)  # one of the rows' own values ("lower")


def test_off_the_routed_rows_a_cascade_reads_nbsvms_cross_fitted_rows_not_its_answers():
    """Where NBSVM answers alone, the cascade's figure is NBSVM's per-row cross-fitted correctness (the C chosen on
    the other half), as NBSVM's own figure is: not its answers at the C chosen on all of validation."""
    transformer, lexical, rows, labels = synthetic()
    choice = choose_fusion(transformer, lexical, rows, steps=21)
    answers_right = lexical.val.argmax(axis=1) == labels["val"]
    honest_rows = answers_right.copy()
    honest_rows[::3] = ~honest_rows[::3]  # the C chosen on the other half gets a third of the rows the other way
    optimistic = cascade(choice, lexical, rows, share=0.2)
    honest = cascade(choice, dataclasses.replace(lexical, honest_rows=honest_rows), rows, share=0.2)
    routed = lexical_confidence(lexical.val) <= honest.threshold
    np.testing.assert_array_equal(honest.choice.honest_rows[~routed], honest_rows[~routed])
    np.testing.assert_array_equal(honest.choice.honest_rows[routed], choice.honest_rows[routed])
    assert honest.choice.honest != optimistic.choice.honest
    np.testing.assert_array_equal(honest.choice.test, optimistic.choice.test)  # what it answers does not move


def test_the_share_grid_runs_up_to_the_budget():
    assert cascade_shares(0.1) == (0.02, 0.05, 0.1)
    assert cascade_shares(0.12) == (0.02, 0.05, 0.1, 0.12)
    assert cascade_shares(0.01) == (0.01,)


def calibrated(seed: int, unsure: float = 0.12):
    """NBSVM sure and right on most texts and a coin on ``unsure`` of them (its confidence near 0.5 there); the
    Transformer right on 90 % of every set. A cascade needs a share of about ``unsure`` to lose nothing."""
    _, _, rows, labels = synthetic(seed)
    rng = np.random.default_rng(seed + 1)

    def nbsvm(y: np.ndarray) -> np.ndarray:
        doubt = rng.random(len(y)) < unsure
        right = np.where(doubt, rng.random(len(y)) < 0.5, True)
        sure = np.where(doubt, 0.52, 0.97)
        positive = np.where(right == (y == 1), sure, 1 - sure) + rng.uniform(-0.01, 0.01, len(y))
        return np.stack([1 - positive, positive], axis=1)

    def transformer(y: np.ndarray) -> np.ndarray:
        return probabilities(y, rng.random(len(y)) < 0.9, rng, sure=0.99)

    def part(scores) -> PartScores:
        return PartScores(
            scores(labels["val"]), scores(labels["test"]), {s: scores(labels[f"crops_{s}"]) for s in ("val", "test")}
        )

    lexical = part(nbsvm)
    lexical = dataclasses.replace(lexical, honest_rows=lexical.val.argmax(axis=1) == labels["val"])
    return part(transformer), lexical, rows, labels


@pytest.mark.parametrize("seed", [0, 1])
def test_the_cascade_takes_the_smallest_share_within_tolerance_and_its_figure_is_cross_fitted_over_that(seed):
    transformer, lexical, rows, labels = calibrated(seed)
    choice = choose_fusion(transformer, lexical, rows, steps=21)
    options = {share: cascade(choice, lexical, rows, share) for share in cascade_shares(0.5)}
    crops_every = choice.crops["val"].argmax(axis=1) == labels["crops_val"]
    first = first_half(len(labels["val"]))
    chosen_shares, moved_by_cross_fitting = set(), False
    for tolerance in (0.0, 0.005, 0.01, 0.02, 0.04, 1.0):

        def acceptable(share: float, reviews: np.ndarray, tolerance: float = tolerance) -> bool:  # the rule, restated
            option = options[share].choice
            crops = reviews[rows.crop_reviews]
            crops_right = option.crops["val"].argmax(axis=1) == labels["crops_val"]
            return bool(
                option.honest_rows[reviews].mean() >= choice.honest_rows[reviews].mean() - tolerance
                and crops_right[crops].mean() >= crops_every[crops].mean() - tolerance
            )

        def rule(reviews: np.ndarray) -> float:
            return next((share for share in options if acceptable(share, reviews)), 0.5)

        chosen = choose_cascade(choice, lexical, rows, budget=0.5, tolerance=tolerance)
        assert list(chosen.by_share) == list(options)
        assert chosen.share == rule(np.ones(len(labels["val"]), dtype=bool))
        chosen_shares.add(chosen.share)
        assert chosen.threshold == options[chosen.share].threshold
        np.testing.assert_array_equal(chosen.choice.test, options[chosen.share].choice.test)
        if tolerance == 0.0:  # it must read the texts NBSVM is unsure of
            assert chosen.share >= 0.12
        if tolerance == 1.0:  # anything goes: the cheapest
            assert chosen.share == 0.02
        # cross-fitted: each half of the validation reviews is scored with the share chosen on the other half
        on_first, on_second = options[rule(first)].choice, options[rule(~first)].choice
        np.testing.assert_array_equal(chosen.choice.honest_rows[first], on_second.honest_rows[first])
        np.testing.assert_array_equal(chosen.choice.honest_rows[~first], on_first.honest_rows[~first])
        assert chosen.choice.honest == pytest.approx(chosen.choice.honest_rows.mean())
        crops_first = first[rows.crop_reviews]
        np.testing.assert_array_equal(chosen.choice.crops["val"][crops_first], on_second.crops["val"][crops_first])
        moved_by_cross_fitting |= chosen.choice.honest != options[chosen.share].choice.honest
    assert len(chosen_shares) >= 3  # the tolerance decides, not the data alone
    assert moved_by_cross_fitting  # somewhere the halves chose differently


def test_a_cascade_none_of_whose_shares_holds_reads_its_budget():
    """NBSVM wrong wherever it answers alone: no share below the budget is within a zero tolerance."""
    transformer, lexical, rows, labels = synthetic()
    choice = choose_fusion(transformer, lexical, rows, steps=21)
    wrong = dataclasses.replace(lexical, honest_rows=np.zeros(len(labels["val"]), dtype=bool))
    assert choose_cascade(choice, wrong, rows, budget=0.3, tolerance=0.0).share == 0.3
