"""Accuracy by length: review-length buckets in tokens and in words, and the sentence-crop set (short texts).

Every candidate's evaluation reports (``metrics.json``; plots ``accuracy_by_length.png`` and ``accuracy_by_words.png``):

- accuracy per bucket of tokens before truncation (whether a bucket was truncated),
- accuracy with a 95 % Wilson interval per bucket of words (``pipeline.text.crops.WORD_BUCKETS``),
- accuracy with its interval on one sentence crop of every validation and test review (``pipeline.text.crops``,
  seed :data:`CROP_SEED`): noisy-labelled short texts, each labelled with its review's label,
- ``validated_min_words``: the word count below which fewer than 1 % of the validation texts (reviews and crops)
  lie, the shortest text a model chosen on them was validated on; ``make score`` counts rows shorter than it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.predictions import prediction_frame
from pipeline.metrics import accuracy_by_group, accuracy_interval
from pipeline.text.crops import CROP_SPLITS, crop_set, word_bucket_names, word_buckets, word_counts
from pipeline.tracking import VALIDATED_MIN_WORDS

CROP_SEED = 2011  # the crops every candidate is scored on (Maas et al. 2011, the dataset's year)
VALIDATED_PERCENTILE = 1.0  # validated_min_words: this percentile of the validation texts' word counts


def length_bucket_accuracy(
    correct: np.ndarray, token_counts: np.ndarray, max_tokens: int, truncates: bool = True
) -> pd.DataFrame:
    """Accuracy per review-length bucket (tokens before truncation), marking truncated buckets.

    Buckets are relative to the cut-off: up to 1/4, 1/2 and all of ``max_tokens`` (whole
    reviews), then up to twice it, and beyond (reviews that lost tokens to truncation, unless the
    model reads them whole: ``truncates=False``, a model scoring long reviews by windows).
    """
    edges = sorted({0, max_tokens // 4, max_tokens // 2, max_tokens, 2 * max_tokens, 10**9})
    correct = np.asarray(correct, dtype=bool)
    rows = []
    for low, high in zip(edges[:-1], edges[1:]):
        in_bucket = (token_counts > low) & (token_counts <= high)
        if in_bucket.any():
            name = f"{low + 1}-{high}" if high < 10**9 else f">{low}"
            rows.append(
                {
                    "bucket": name,
                    "reviews": int(in_bucket.sum()),
                    "accuracy": float(correct[in_bucket].mean()),
                    "truncated": bool(truncates and low >= max_tokens),
                }
            )
    return pd.DataFrame(rows)


def crop_frames(val: pd.DataFrame, test: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The sentence crops every evaluation scores: one per validation and one per test review."""
    return crop_set({"val": val, "test": test}, CROP_SEED)


def validation_crops(val: pd.DataFrame) -> pd.DataFrame:
    """:func:`crop_frames`' validation crops alone (the same draw), without cropping the test reviews."""
    return crop_set({"val": val}, CROP_SEED)["val"]


def crop_predictions(
    crops: dict[str, pd.DataFrame], probabilities: dict[str, np.ndarray], names: list[str]
) -> pd.DataFrame:
    """The crops' predictions (``prediction_frame`` columns, plus ``split``, ``review``: the review's row in its split,
    and ``words``), validation then test."""
    frames = []
    for split in CROP_SPLITS:
        crop = crops[split]
        frame = prediction_frame(crop["source_file"], crop["label"].to_numpy(), probabilities[split], names)
        frame.insert(0, "split", split)
        frames.append(frame.assign(review=crop["review"].to_numpy(), words=word_counts(crop["text"].tolist())))
    return pd.concat(frames, ignore_index=True)


def metric_suffix(bucket: str) -> str:
    """A word bucket's name as MLflow takes it in a metric name (``<=25`` -> ``le25``, ``>250`` -> ``gt250``)."""
    return bucket.replace("<=", "le").replace(">", "gt")


def length_report(test: pd.DataFrame, val: pd.DataFrame, correct: np.ndarray, crops: pd.DataFrame) -> dict:
    """Accuracy by word bucket of the test reviews, on the validation and test crops, and the validated length;
    ``metrics`` holds what is logged to the run."""
    words = word_counts(test["text"].tolist())
    by_words = accuracy_by_group(correct, word_buckets(words), word_bucket_names())
    on_crops = {
        split: accuracy_interval(crops.loc[crops["split"] == split, "correct"].to_numpy()) for split in CROP_SPLITS
    }
    validation_words = np.concatenate(
        [word_counts(val["text"].tolist()), crops.loc[crops["split"] == "val", "words"].to_numpy()]
    )
    validated = int(np.percentile(validation_words, VALIDATED_PERCENTILE)) if len(validation_words) else 0
    metrics = {
        "test_crop_accuracy": on_crops["test"]["accuracy"],
        "val_crop_accuracy": on_crops["val"]["accuracy"],
        VALIDATED_MIN_WORDS: float(validated),
        **{f"test_accuracy_words_{metric_suffix(row['bucket'])}": row["accuracy"] for row in by_words},
    }
    return {
        "accuracy_by_words": by_words,
        "sentence_crops": {**on_crops, "seed": CROP_SEED},
        "validated_min_words": validated,
        "metrics": metrics,
    }


def plot_length_buckets(buckets: pd.DataFrame, path: Path) -> Path:
    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure(7, 4)
    colors = ["tab:orange" if truncated else "tab:blue" for truncated in buckets["truncated"]]
    bars = axis.bar(buckets["bucket"], buckets["accuracy"], color=colors)
    for bar, count in zip(bars, buckets["reviews"]):
        axis.annotate(
            f"n={count}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
        )
    axis.set(
        xlabel="review length in tokens (orange: truncated)",
        ylabel="accuracy",
        ylim=(max(0.0, buckets["accuracy"].min() - 0.1), 1.0),
        title="Accuracy by review length (test)",
    )
    return save_figure(figure, path)


def plot_word_buckets(report: dict, path: Path) -> Path:
    """Bars of accuracy per word bucket of the test reviews and on the test crops, with 95 % Wilson intervals."""
    from pipeline.core.plots import new_figure, save_figure

    rows = [(f"{row['bucket']} words", row, "tab:blue") for row in report["accuracy_by_words"]]
    rows.append(("sentence crops\n(noisy labels)", report["sentence_crops"]["test"], "tab:orange"))
    figure, axis = new_figure(7.5, 4)
    for x, (_label, row, colour) in enumerate(rows):
        axis.bar(x, row["accuracy"], color=colour)
        below, above = max(0.0, row["accuracy"] - row["ci_low"]), max(0.0, row["ci_high"] - row["accuracy"])
        axis.errorbar(x, row["accuracy"], yerr=[[below], [above]], color="black", capsize=4)
        axis.annotate(f"n={row['rows']:,}", (x, row["ci_high"]), ha="center", va="bottom", fontsize=8)
    axis.set_xticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8)
    lowest = min(row["ci_low"] for _, row, _ in rows)
    axis.set(
        ylabel="accuracy (95% Wilson interval)",
        ylim=(max(0.0, lowest - 0.1), 1.02),
        title="Accuracy by length in words (test reviews) and on one sentence crop per test review",
    )
    return save_figure(figure, path)
