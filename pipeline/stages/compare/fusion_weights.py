"""Choosing a fused candidate's weights on validation: one weight, or with ``compare.short_fusion_words`` one for
short texts and one for the rest (a length-aware fusion). Pure: probabilities and word counts in, the choice out.

A length-aware fusion's long weight is chosen on the validation reviews longer than the limit, its short weight on
the short validation reviews and the validation sentence crops of at most that many words (the texts a scorer of
short reviews will meet; IMDB has few short reviews). The validation figures the champion is chosen on
(``val_accuracy_cross_fitted`` and the validation crops' accuracy) must not be scored on the rows a weight was chosen
on, so the short texts' validation probabilities are cross-fitted (``pipeline.metrics.cross_fitted_fusion``: each
half of the reviews, a crop with its review, fused with the weight chosen on the other half), and the long reviews'
accuracy is the cross-fitted accuracy of choosing their weight. Test probabilities use the two weights chosen on all of
validation, each text by its word count, as the fused model scores.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pipeline.core.predictions import FusionRule, cascade_probabilities, cascade_threshold, fuse_probabilities
from pipeline.metrics import (
    cross_fitted_accuracy,
    cross_fitted_correct,
    cross_fitted_fusion,
    first_half,
    fusion_weight_scan,
)

MIN_ROWS = 20  # fewer short (or long) validation texts than this: one weight for all (too few to choose on)


@dataclass(frozen=True)
class PartScores:
    """One part's (the Transformer's or NBSVM's) probabilities on what a comparison evaluates."""

    val: np.ndarray
    test: np.ndarray
    crops: dict[str, np.ndarray]  # per crop split
    # per validation row, whether the part's own choice made on the other half of validation gets it right (NBSVM's C,
    # ``metrics.cross_fitted_correct``); None: its validation answers as they are
    honest_rows: np.ndarray | None = None


@dataclass(frozen=True)
class EvaluatedRows:
    """What a fusion is chosen and applied on: the validation labels, every row's word count, and the validation
    crops' labels and the review each was cut from."""

    val_labels: np.ndarray
    val_words: np.ndarray
    test_words: np.ndarray
    crop_words: dict[str, np.ndarray]
    crop_labels: np.ndarray  # the validation crops'
    crop_reviews: np.ndarray  # the validation crops' review rows


@dataclass(frozen=True)
class FusionChoice:
    weight: float  # the Transformer's weight (for texts longer than short_max_words when set)
    short_weight: float  # for texts of at most short_max_words words (= weight without a limit)
    short_max_words: int  # 0: one weight
    by_weight: dict[float, float]  # validation accuracy of every weight tried (the long texts' with a limit)
    honest: float  # cross-fitted validation accuracy of choosing the weight(s) this way
    honest_rows: np.ndarray  # per validation review, whether it is right in that cross-fitted figure
    val: np.ndarray  # the fused validation probabilities (short texts cross-fitted)
    test: np.ndarray
    crops: dict[str, np.ndarray]  # per crop split (validation crops of short texts cross-fitted)


def one_weight(transformer: PartScores, lexical: PartScores, rows: EvaluatedRows, steps: int) -> FusionChoice:
    weight, by_weight, correct = fusion_weight_scan(transformer.val, lexical.val, rows.val_labels, steps)
    return FusionChoice(
        weight,
        weight,
        0,
        by_weight,
        cross_fitted_accuracy(correct),
        cross_fitted_correct(correct),
        fuse_probabilities(transformer.val, lexical.val, weight),
        fuse_probabilities(transformer.test, lexical.test, weight),
        {
            split: fuse_probabilities(transformer.crops[split], lexical.crops[split], weight)
            for split in transformer.crops
        },
    )


def choose_fusion(
    transformer: PartScores, lexical: PartScores, rows: EvaluatedRows, steps: int, short_max_words: int = 0
) -> FusionChoice:
    """The fusion's weight or weights and its probabilities on validation, test and the crops (module docstring)."""
    if not short_max_words:
        return one_weight(transformer, lexical, rows, steps)
    long = rows.val_words > short_max_words
    short_crops = rows.crop_words["val"] <= short_max_words
    if min(long.sum(), (~long).sum() + short_crops.sum()) < MIN_ROWS:
        return one_weight(transformer, lexical, rows, steps)
    weight, by_weight, correct = fusion_weight_scan(
        transformer.val[long], lexical.val[long], rows.val_labels[long], steps
    )
    honest_long = cross_fitted_accuracy(correct)
    short_reviews = np.flatnonzero(~long)
    short_weight, honest_short = cross_fitted_fusion(
        np.concatenate([transformer.val[~long], transformer.crops["val"][short_crops]]),
        np.concatenate([lexical.val[~long], lexical.crops["val"][short_crops]]),
        np.concatenate([rows.val_labels[~long], rows.crop_labels[short_crops]]),
        np.concatenate([short_reviews, rows.crop_reviews[short_crops]]),
        steps,
    )

    def by_length(t: np.ndarray, x: np.ndarray, words: np.ndarray) -> np.ndarray:
        return fuse_probabilities(t, x, np.where(words <= short_max_words, short_weight, weight))

    val = by_length(transformer.val, lexical.val, rows.val_words)
    val[~long] = honest_short[: len(short_reviews)]
    crops = {
        split: by_length(transformer.crops[split], lexical.crops[split], rows.crop_words[split])
        for split in transformer.crops
    }
    crops["val"][short_crops] = honest_short[len(short_reviews) :]
    short_correct = (val[~long].argmax(axis=1) == rows.val_labels[~long]).sum()
    honest = float((honest_long * long.sum() + short_correct) / len(long))
    honest_rows = val.argmax(axis=1) == rows.val_labels
    honest_rows[long] = cross_fitted_correct(correct)
    return FusionChoice(
        weight,
        short_weight,
        short_max_words,
        by_weight,
        honest,
        honest_rows,
        val,
        by_length(transformer.test, lexical.test, rows.test_words),
        crops,
    )


CASCADE_SHARES = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)  # the shares a cascade chooses among, up to its budget


def cascade_shares(budget: float) -> tuple[float, ...]:
    """The shares of texts a cascade's Transformer may read, smallest first: the grid's below ``budget``
    (``compare.cascade_share``) and the budget itself."""
    return (*(share for share in CASCADE_SHARES if share < budget), budget)


@dataclass(frozen=True)
class Cascade:
    """A fusion that reads with its Transformer only the texts NBSVM is least sure of (``compare.cascade_share``):
    the figures it is chosen and reported on, and what it saves."""

    choice: FusionChoice  # val, test and crops probabilities and the cross-fitted figure, as the cascade answers
    threshold: float  # texts whose NBSVM confidence is at most this read both parts; the rest NBSVM's answer
    routed: dict[str, float]  # the share of each evaluated set read by the Transformer: val, test, crops_<split>
    share: float  # the share of validation reviews the threshold lets the Transformer read
    # every share tried: (its validation accuracy, cross-fitted; its validation crops' accuracy), on all of validation
    by_share: dict[float, tuple[float, float]] = dataclasses.field(default_factory=dict)


def cascade(choice: FusionChoice, lexical: PartScores, rows: EvaluatedRows, share: float) -> Cascade:
    """``choice`` (the fusion of every text) as a cascade: the threshold is the NBSVM confidence of the ``share`` of
    validation reviews it is least sure of (no label read, so the validation figures stay honest), and every text above
    it keeps NBSVM's probability. The cross-fitted figure: the fusion's cross-fitted rows where the Transformer reads,
    NBSVM's own cross-fitted rows elsewhere (``lexical.honest_rows``: right with the C chosen on the other half; without
    them, its answers)."""
    threshold = cascade_threshold(lexical.val, share)
    rule = FusionRule(choice.weight, choice.short_weight, choice.short_max_words, threshold)  # as the model answers
    parts = {  # each evaluated set: (the fusion's probabilities, NBSVM's)
        "val": (choice.val, lexical.val),
        "test": (choice.test, lexical.test),
        **{f"crops_{split}": (choice.crops[split], lexical.crops[split]) for split in choice.crops},
    }
    read = {name: rule.reads(nbsvm) for name, (_, nbsvm) in parts.items()}
    answers = {name: cascade_probabilities(fused, nbsvm, read[name]) for name, (fused, nbsvm) in parts.items()}
    nbsvm_rows = lexical.val.argmax(axis=1) == rows.val_labels if lexical.honest_rows is None else lexical.honest_rows
    honest_rows = np.where(read["val"], choice.honest_rows, nbsvm_rows)
    cascaded = dataclasses.replace(
        choice,
        honest=float(honest_rows.mean()),
        honest_rows=honest_rows,
        val=answers["val"],
        test=answers["test"],
        crops={split: answers[f"crops_{split}"] for split in choice.crops},
    )
    routed = {name: float(mask.mean()) for name, mask in read.items()}
    return Cascade(cascaded, threshold, routed, share)


def choose_cascade(
    choice: FusionChoice, lexical: PartScores, rows: EvaluatedRows, budget: float, tolerance: float, seed: int = 0
) -> Cascade:
    """The cascade of ``choice`` at the smallest share of :func:`cascade_shares` whose validation accuracy
    (cross-fitted) and validation crops' accuracy are both within ``tolerance`` (``compare.champion_tolerance``) of the
    fusion of every text's; none within it: the budget. Its validation figures are cross-fitted over that choice too:
    each half of the validation reviews (a crop with its review) gets the share chosen on the other half
    (``metrics.first_half``, the halves every other choice is cross-fitted on)."""
    shares = cascade_shares(budget)
    options = {share: cascade(choice, lexical, rows, share) for share in shares}
    every_crops = choice.crops["val"].argmax(axis=1) == rows.crop_labels

    def crops_right(option: Cascade) -> np.ndarray:
        return option.choice.crops["val"].argmax(axis=1) == rows.crop_labels

    def within(right: np.ndarray, every: np.ndarray) -> bool:
        return not len(right) or float(right.mean()) >= float(every.mean()) - tolerance

    def chosen_on(reviews: np.ndarray) -> float:
        crops = reviews[rows.crop_reviews]
        for share in shares:
            option = options[share]
            if within(option.choice.honest_rows[reviews], choice.honest_rows[reviews]) and within(
                crops_right(option)[crops], every_crops[crops]
            ):
                return share
        return budget

    chosen = options[chosen_on(np.ones(len(rows.val_labels), dtype=bool))]
    first = first_half(len(rows.val_labels), seed)
    on_first, on_second = options[chosen_on(first)].choice, options[chosen_on(~first)].choice  # each scores the other
    honest_rows = np.where(first, on_second.honest_rows, on_first.honest_rows)
    first_crops = first[rows.crop_reviews]
    crops = {
        **chosen.choice.crops,
        "val": np.where(first_crops[:, None], on_second.crops["val"], on_first.crops["val"]),
    }
    honest = dataclasses.replace(
        chosen.choice,
        honest=float(honest_rows.mean()),
        honest_rows=honest_rows,
        val=np.where(first[:, None], on_second.val, on_first.val),
        crops=crops,
    )
    by_share = {
        share: (option.choice.honest, float(crops_right(option).mean()) if len(every_crops) else float("nan"))
        for share, option in options.items()
    }
    return dataclasses.replace(chosen, choice=honest, by_share=by_share)
