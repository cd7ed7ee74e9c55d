"""Behaviour tests in the CheckList style: how a sentiment model handles simple language.

Accuracy on held-out reviews says little about *which* language a model gets wrong. Following
CheckList (Ribeiro et al., 2020), this module writes its own short sentences from templates and
checks three kinds of expectation per capability:

- MFT (minimum functionality): the sentence has a known label ("The plot was not good." is negative).
- INV (invariance): a change that must not flip the label (another name, casing, punctuation, a typo).
- DIR (directional): a change that must move the probability one way only (an intensifier must not
  lower the confidence in the sentence's label, a hedge must not raise it), within ``TOLERANCE``.

Capabilities: negation, contrast, intensifiers, hedges, names, casing, punctuation, typos and
verdict at the end (a longer review whose conclusion reverses its opening). Nothing here comes from a
dataset; the sentences are generated deterministically, so every run of every model sees the same
cases and pass rates are comparable across runs. The suite is pure: it takes a function from texts
to ``[N, k]`` class probabilities and the model's label names.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

NEGATIVE, POSITIVE = "negative", "positive"
TOLERANCE = 0.02  # DIR cases: probability may move this much the "wrong" way and still pass
FAILURES_SHOWN = 5  # failing sentences listed per capability in the report

CAPABILITIES = (
    "negation",
    "contrast",
    "intensifiers",
    "hedges",
    "names",
    "casing",
    "punctuation",
    "typos",
    "verdict at the end",
)

_NOUNS = ("movie", "film", "acting", "story", "script", "ending", "soundtrack", "cast")
_POSITIVE = ("good", "great", "wonderful", "excellent", "brilliant", "enjoyable")
_NEGATIVE = ("bad", "terrible", "awful", "boring", "dreadful", "dull")
_INTENSIFIERS = ("really", "very", "incredibly", "truly", "extremely")
_HEDGES = ("somewhat", "fairly", "slightly", "kind of", "a little")
_NAMES = ("Anna", "Ben", "Maria", "Kenji", "Oluwaseun", "Priya", "Dmitri", "Sofia", "Jamal", "Chloe")
_FILLER = (
    "The story follows a family that moves to a small town by the sea.",
    "Most of it was filmed on location over one long summer.",
    "The director also wrote the script, based on a short novel.",
    "It runs a little under two hours and has three main characters.",
    "I saw it on a Sunday afternoon with two friends.",
)


@dataclass(frozen=True)
class Case:
    capability: str
    kind: str  # MFT | INV | DIR
    text: str
    expected: str = ""  # MFT: the label it must get; DIR: the label whose probability is watched
    original: str = ""  # INV / DIR: the sentence it was derived from
    direction: int = 0  # DIR: +1 the watched probability must not fall, -1 it must not rise


def _sentence(noun: str, adjective: str) -> str:
    return f"The {noun} was {adjective}."


def _typo(text: str, rng: random.Random) -> str:
    """Swap two different adjacent letters inside one word of four or more letters."""
    spots = [
        i
        for word in re.finditer(r"[A-Za-z]{4,}", text)
        for i in range(word.start(), word.end() - 1)
        if text[i] != text[i + 1]
    ]
    i = rng.choice(spots)
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :]


def build_suite(per_capability: int = 24, seed: int = 0) -> list[Case]:
    """The cases, ``per_capability`` of each capability (fewer where the templates run out)."""
    rng = random.Random(seed)
    pairs = [
        (noun, adjective, sentiment)
        for noun in _NOUNS
        for sentiment, adjectives in ((POSITIVE, _POSITIVE), (NEGATIVE, _NEGATIVE))
        for adjective in adjectives
    ]
    rng.shuffle(pairs)
    opposite = {POSITIVE: NEGATIVE, NEGATIVE: POSITIVE}
    cases: list[Case] = []

    def take(items):
        return items[:per_capability]

    cases += take(
        [
            Case("negation", "MFT", template.format(noun=noun, adjective=adjective), opposite[sentiment])
            for (noun, adjective, sentiment), template in zip(
                pairs,
                itertools.cycle(
                    (
                        "The {noun} was not {adjective}.",
                        "I would not call the {noun} {adjective}.",
                        "The {noun} was not {adjective} at all.",
                        "Honestly, the {noun} is not {adjective}.",
                    )
                ),
            )
        ]
    )
    contrast = []
    for noun, adjective, sentiment in pairs:
        other_noun = rng.choice([n for n in _NOUNS if n != noun])
        other = rng.choice(_POSITIVE if sentiment == NEGATIVE else _NEGATIVE)
        contrast.append(
            Case("contrast", "MFT", f"The {other_noun} was {other}, but overall the {noun} was {adjective}.", sentiment)
        )
    cases += take(contrast)
    for capability, words, direction in (("intensifiers", _INTENSIFIERS, +1), ("hedges", _HEDGES, -1)):
        cases += take(
            [
                Case(
                    capability,
                    "DIR",
                    f"The {noun} was {rng.choice(words)} {adjective}.",
                    sentiment,
                    _sentence(noun, adjective),
                    direction,
                )
                for noun, adjective, sentiment in pairs
            ]
        )
    names = []
    for noun, adjective, sentiment in pairs:
        first, second = rng.sample(_NAMES, 2)
        template = "{name} was {adjective} in this {noun}."
        names.append(
            Case(
                "names",
                "INV",
                template.format(name=second, adjective=adjective, noun=noun),
                sentiment,
                template.format(name=first, adjective=adjective, noun=noun),
            )
        )
    cases += take(names)
    bases = [f"I thought the {noun} was {adjective}, and I would tell my friends." for noun, adjective, _ in pairs]
    cases += take(
        [Case("casing", "INV", text.upper() if i % 2 else text.lower(), "", text) for i, text in enumerate(bases)]
    )
    cases += take(
        [
            Case("punctuation", "INV", text.rstrip(".") + ("!!!" if i % 2 else ""), "", text)
            for i, text in enumerate(bases)
        ]
    )
    cases += take([Case("typos", "INV", _typo(text, rng), "", text) for text in bases])
    endings = []
    for noun, adjective, sentiment in pairs:
        opening = rng.choice(_NEGATIVE if sentiment == POSITIVE else _POSITIVE)
        filler = " ".join(rng.sample(_FILLER, 3))
        endings.append(
            Case(
                "verdict at the end",
                "MFT",
                f"At first the {noun} seemed {opening}. {filler} In the end, though, I found it "
                f"{adjective} from start to finish.",
                sentiment,
            )
        )
    cases += take(endings)
    return cases


def evaluate_suite(
    cases: Sequence[Case], predict: Callable[[list[str]], np.ndarray], labels: Sequence[str]
) -> pd.DataFrame:
    """One row per case: its texts, the predictions and whether it passed.

    ``predict`` maps texts to ``[N, k]`` class probabilities; ``labels`` names the k classes and
    must include ``negative`` and ``positive``.
    """
    labels = list(labels)
    missing = [name for name in (NEGATIVE, POSITIVE) if name not in labels]
    if missing:
        raise ValueError(f"behaviour tests need the labels {NEGATIVE!r} and {POSITIVE!r}; the model has {labels}")
    texts = [case.text for case in cases]
    originals = [case.original for case in cases if case.original]
    probabilities = np.asarray(predict(texts + originals), dtype=np.float64)
    here, before = probabilities[: len(texts)], probabilities[len(texts) :]
    before_rows = iter(before)
    rows = []
    for case, p in zip(cases, here):
        q = next(before_rows) if case.original else None
        predicted = labels[int(np.argmax(p))]
        original_label = labels[int(np.argmax(q))] if q is not None else ""
        if case.kind == "MFT":
            passed = predicted == case.expected
        elif case.kind == "INV":
            passed = predicted == original_label
        else:
            if q is None:
                raise ValueError(f"{case.kind} case {case.text!r} has no original sentence to compare with")
            watched = labels.index(case.expected)
            change = (p[watched] - q[watched]) * case.direction
            passed = change >= -TOLERANCE
        rows.append(
            {
                "capability": case.capability,
                "kind": case.kind,
                "text": case.text,
                "original": case.original,
                "expected": case.expected,
                "predicted": predicted,
                "original_predicted": original_label,
                "positive_probability": float(p[labels.index(POSITIVE)]),
                "original_positive_probability": float(q[labels.index(POSITIVE)]) if q is not None else np.nan,
                "passed": bool(passed),
            }
        )
    return pd.DataFrame(rows)


def pass_rates(results: pd.DataFrame) -> pd.DataFrame:
    """Per capability (in ``CAPABILITIES`` order): kind, cases, passed, pass_rate."""
    grouped = results.groupby("capability", sort=False).agg(
        kind=("kind", "first"), cases=("passed", "size"), passed=("passed", "sum")
    )
    grouped["pass_rate"] = grouped["passed"] / grouped["cases"]
    order = [c for c in CAPABILITIES if c in grouped.index]
    return grouped.loc[order].reset_index()


def metric_name(capability: str) -> str:
    """The MLflow metric for a capability's pass rate, e.g. ``behaviour_verdict_at_the_end``."""
    return "behaviour_" + re.sub(r"[^a-z0-9]+", "_", capability.lower()).strip("_")


def capability_of(metric: str) -> str | None:
    for capability in CAPABILITIES:
        if metric_name(capability) == metric:
            return capability
    return None


def markdown_report(results: pd.DataFrame, title: str) -> str:
    rates = pass_rates(results)
    lines = [
        f"# Behaviour report: {title}",
        "",
        "CheckList-style capability tests on sentences this project writes (`pipeline/stages/evaluate/behaviour.py`). "
        "MFT: the sentence has a known label. INV: the change must not flip the label. DIR: the change must "
        f"not move the label's probability the wrong way by more than {TOLERANCE}.",
        "",
        "| capability | test | cases | passed | pass rate |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r.capability} | {r.kind} | {r.cases} | {r.passed} | {r.pass_rate:.0%} |" for r in rates.itertuples()]
    lines += [
        "",
        f"Overall: {int(rates['passed'].sum())} of {int(rates['cases'].sum())} cases passed.",
        "",
        "## Failures",
        "",
    ]
    failed = results[~results["passed"]]
    if failed.empty:
        lines.append("None.")
    for capability, group in failed.groupby("capability", sort=False):
        lines += [f"### {capability} ({len(group)} failed)", ""]
        for row in group.head(FAILURES_SHOWN).itertuples():
            if row.kind == "MFT":
                lines.append(
                    f'- "{row.text}": expected {row.expected}, got {row.predicted} '
                    f"(p positive {row.positive_probability:.2f})"
                )
            else:
                lines.append(
                    f'- "{row.original}" -> "{row.text}": {row.original_predicted} '
                    f"({row.original_positive_probability:.2f}) -> {row.predicted} "
                    f"({row.positive_probability:.2f})"
                )
        if len(group) > FAILURES_SHOWN:
            lines.append(f"- ... and {len(group) - FAILURES_SHOWN} more (behaviour.csv)")
        lines.append("")
    return "\n".join(lines)
