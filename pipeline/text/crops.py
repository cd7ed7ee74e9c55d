"""Sentence crops: one- or two-sentence excerpts of reviews, and review lengths in words (pure, no I/O).

IMDB holds almost no short texts (0.1 % of its test reviews have 20 words or fewer), yet users score one-sentence
reviews. A sentence crop stands in for them: a random run of one or two consecutive sentences of a review, labelled
with the review's label. The label is noisy both ways (a positive review has negative sentences), so accuracy on crops
measures a model on short texts only up to that noise: it is a proxy, used to compare models, not an absolute figure.

Construction (:func:`sentence_crops`): a review is split into sentences after ``.``, ``!`` or ``?`` followed by
white space, and at line breaks; the number of sentences (1 or 2, even odds) and the first sentence are drawn
uniformly with ``numpy.random.default_rng(seed)``, one draw per review in the frame's order, so the same frame and
seed give the same crops on every machine. A crop keeps its review's ``source_file`` and split: crops of the
validation split come from validation reviews only, those of the test split from test reviews only.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
WORD_BUCKETS = (25, 80, 250)  # upper bounds in words; the last bucket is everything longer
CROP_SPLITS = ("val", "test")


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (``SENTENCE_BREAK``), empty pieces dropped."""
    return [piece.strip() for piece in SENTENCE_BREAK.split(text) if piece.strip()]


def word_counts(texts) -> np.ndarray:
    """Words (runs of non-space characters) per text."""
    return np.fromiter((len(str(text).split()) for text in texts), dtype=np.int64, count=len(texts))


def sentence_crops(frame: pd.DataFrame, seed: int, per_review: int = 1) -> pd.DataFrame:
    """``per_review`` random 1-2-sentence crops of every review of ``frame`` (``text``, ``label`` and, when present,
    ``source_file``), as a frame with the same columns plus ``review`` (the row's position in ``frame``), review by
    review in ``frame``'s order."""
    if per_review < 1:
        raise ValueError(f"per_review must be positive, got {per_review}")
    rng = np.random.default_rng(seed)
    draws = rng.random((len(frame), per_review, 2))
    texts = []
    for row, text in enumerate(frame["text"].tolist()):
        pieces = sentences(text) or [text]
        for take_two, start in draws[row]:
            length = 2 if take_two >= 0.5 and len(pieces) > 1 else 1
            first = int(start * (len(pieces) - length + 1))
            texts.append(" ".join(pieces[first : first + length]))
    review = np.repeat(np.arange(len(frame)), per_review)
    crops = pd.DataFrame({"text": texts, "label": frame["label"].to_numpy()[review], "review": review})
    if "source_file" in frame:
        crops.insert(0, "source_file", frame["source_file"].to_numpy()[review])
    return crops


def crop_set(splits: dict[str, pd.DataFrame], seed: int) -> dict[str, pd.DataFrame]:
    """One crop per review of the validation and test splits (``CROP_SPLITS``) that ``splits`` holds, each split's
    crops drawn with its own seed (``seed`` + the split's index) so that neither depends on the other's size."""
    return {
        split: sentence_crops(splits[split], seed + index) for index, split in enumerate(CROP_SPLITS) if split in splits
    }


def word_bucket_names(bounds: tuple[int, ...] = WORD_BUCKETS) -> list[str]:
    lows = (0, *bounds)
    return [f"<={bounds[0]}"] + [f"{low + 1}-{high}" for low, high in zip(lows[1:], bounds[1:])] + [f">{bounds[-1]}"]


def word_buckets(counts: np.ndarray, bounds: tuple[int, ...] = WORD_BUCKETS) -> np.ndarray:
    """The bucket name (:func:`word_bucket_names`) of each word count."""
    return np.asarray(word_bucket_names(bounds), dtype=object)[np.searchsorted(bounds, counts, side="left")]
