"""The behaviour suite's mechanics: generated cases, pass/fail rules, pass rates and the report.

No test here asserts how well a model does: the predictors are written for each rule.
"""

import numpy as np
import pytest

from pipeline.stages.evaluate import behaviour
from pipeline.stages.evaluate.behaviour import CAPABILITIES, build_suite, evaluate_suite, markdown_report, pass_rates

LABELS = ["negative", "positive"]


def as_probabilities(positive: list[float]) -> np.ndarray:
    positive = np.asarray(positive, dtype=np.float64)
    return np.column_stack([1 - positive, positive])


def oracle(cases):
    """A predictor that gets every case right: the expected label, and the original's label under changes."""
    answers = {}
    for case in cases:
        label = case.expected or "positive"
        p = 0.9 if label == "positive" else 0.1
        answers[case.text] = p
        if case.original:  # unchanged by the change: passes INV and both directions of DIR
            answers[case.original] = p
    return lambda texts: as_probabilities([answers[t] for t in texts])


def test_suite_covers_every_capability_deterministically():
    cases = build_suite(per_capability=10, seed=3)
    assert [c.capability for c in cases[::10]] == list(CAPABILITIES)
    assert cases == build_suite(per_capability=10, seed=3)
    assert cases != build_suite(per_capability=10, seed=4)
    for case in cases:
        assert case.kind in ("MFT", "INV", "DIR")
        if case.kind == "MFT":
            assert case.expected in LABELS and not case.original
        else:
            assert case.original and case.original != case.text
    casing = [c for c in cases if c.capability == "casing"]
    assert all(c.text in (c.original.upper(), c.original.lower()) for c in casing)
    for case in (c for c in cases if c.capability == "typos"):  # two adjacent letters swapped, nothing else
        diff = [i for i, (a, b) in enumerate(zip(case.text, case.original)) if a != b]
        assert len(case.text) == len(case.original) and len(diff) == 2 and diff[1] == diff[0] + 1
        assert case.text[diff[0]] == case.original[diff[1]]
    negation = [c for c in cases if c.capability == "negation"]
    assert all(" not " in c.text for c in negation)


def test_an_oracle_passes_everything_and_a_keyword_model_fails_negation():
    cases = build_suite(per_capability=12)
    rates = pass_rates(evaluate_suite(cases, oracle(cases), LABELS)).set_index("capability")["pass_rate"]
    assert (rates == 1.0).all() and list(rates.index) == list(CAPABILITIES)

    positive_words = ("good", "great", "wonderful", "excellent", "brilliant", "enjoyable")

    def keyword(texts):
        return as_probabilities([0.9 if any(w in t.lower() for w in positive_words) else 0.1 for t in texts])

    results = evaluate_suite(cases, keyword, LABELS)
    rates = pass_rates(results).set_index("capability")
    assert rates.loc["negation", "pass_rate"] == 0.0  # "not good" has the positive word
    assert rates.loc["casing", "pass_rate"] == 1.0
    assert rates.loc["negation", "cases"] == 12 and rates.loc["negation", "kind"] == "MFT"


def test_invariance_and_direction_rules():
    cases = build_suite(per_capability=6)
    shouting = lambda texts: as_probabilities([0.1 if t.isupper() else 0.9 for t in texts])  # noqa: E731
    rates = pass_rates(evaluate_suite(cases, shouting, LABELS)).set_index("capability")["pass_rate"]
    assert rates["casing"] == pytest.approx(0.5)  # half the casing cases are upper case
    assert rates["names"] == 1.0

    def weakened_by(words):
        return lambda texts: as_probabilities([0.6 if any(f" {w} " in t for w in words) else 0.9 for t in texts])

    intensifiers = evaluate_suite(
        [c for c in cases if c.capability == "intensifiers"], weakened_by(behaviour._INTENSIFIERS), LABELS
    )
    positives = intensifiers["expected"] == "positive"
    assert (~intensifiers.loc[positives, "passed"]).all()  # "very good" less positive than "good": a failure
    assert intensifiers.loc[~positives, "passed"].all()  # "very bad" less positive than "bad": as it should be


def test_report_lists_rates_and_failing_sentences():
    cases = build_suite(per_capability=8)
    positive_words = ("good", "great", "wonderful", "excellent", "brilliant", "enjoyable")

    def keyword(texts):
        return as_probabilities([0.9 if any(w in t.lower() for w in positive_words) else 0.1 for t in texts])

    results = evaluate_suite(cases, keyword, LABELS)
    text = markdown_report(results, "a keyword model")
    assert text.startswith("# Behaviour report: a keyword model")
    assert "| negation | MFT | 8 | 0 | 0% |" in text
    first_failure = results[(results["capability"] == "negation")].iloc[0]
    assert f'"{first_failure["text"]}": expected {first_failure["expected"]}' in text
    assert "... and 3 more" in text  # 8 failures, 5 shown


def test_metric_names_round_trip_and_labels_are_checked():
    for capability in CAPABILITIES:
        name = behaviour.metric_name(capability)
        assert name.startswith("behaviour_") and " " not in name
        assert behaviour.capability_of(name) == capability
    assert behaviour.capability_of("test_accuracy") is None
    with pytest.raises(ValueError, match="need the labels"):
        evaluate_suite(build_suite(2), lambda texts: np.zeros((len(texts), 2)), ["bad", "good"])
