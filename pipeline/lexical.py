"""The lexical models the Transformer is measured against, fused with, and taught by.

- :func:`nbsvm_baseline`: NBSVM (Wang & Manning 2012) in the fastai form: binary 1-3-gram counts scaled by the
  naive-Bayes log-count ratio ``r``, then a liblinear logistic regression. Its regularisation ``C`` is chosen on the
  validation split from ``nbsvm.c_values``; the vectorizer, ``r`` and the regression are fitted on the train split
  (and sentence crops) only. It is the comparison's baseline, a candidate for ``@champion``, the lexical half of
  every fused model and the teacher of ``make pseudo-label``.
- :func:`tfidf_baseline`: TF-IDF (1-2 grams) + logistic regression, the earlier baseline, a second reference row.
- :class:`NbsvmArrays`: a fitted NBSVM as plain arrays in a versioned ``.npz`` (no pickle): the same probabilities
  bit for bit, loaded in a fraction of the time its ``joblib`` file takes.

All three give ``predict_proba(texts)`` as ``[N, k]`` in class-index order, like the Transformer. Texts are
expected cleaned (``pipeline.text.conventions.clean_text``), as ingestion stores them and the pyfunc models pass them.
"""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin

from pipeline.core.errors import ConfigError, InputError, MissingInputError
from pipeline.core.files import atomic_replace
from pipeline.core.logs import duration
from pipeline.text.crops import sentence_crops
from pipeline.text.ngram_counts import NgramCounts, NgramVocabulary

NBSVM_TOKEN_PATTERN = r"(?u)\b\w+\b|[!?]"  # words, and ! and ? as tokens of their own


class NaiveBayesLogisticRegression(ClassifierMixin, BaseEstimator):
    """Logistic regression on features scaled by the naive-Bayes log-count ratio (NBSVM's "NB-LR").

    Two classes: one ratio ``r = log((p / |p|) / (q / |q|))`` with ``p``, ``q`` the add-``alpha`` feature
    counts of the second and first class. More classes: one ratio and one regression per class
    against the rest, their probabilities normalised to sum to one. A scikit-learn style estimator
    (``fit``, ``predict_proba``, ``classes_``) that pickles with ``joblib``.
    """

    def __init__(self, C: float = 0.1, alpha: float = 1.0, max_iter: int = 1000, seed: int = 0):
        self.C = C
        self.alpha = alpha
        self.max_iter = max_iter
        self.seed = seed

    def _ratio(self, X, positive: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        if weights is None:
            p = self.alpha + np.asarray(X[positive].sum(axis=0)).ravel()
            q = self.alpha + np.asarray(X[~positive].sum(axis=0)).ravel()
        else:  # a row counts as much as its weight (soft labels come as two weighted rows, one per class)
            p = self.alpha + np.asarray(X.T @ (weights * positive)).ravel()
            q = self.alpha + np.asarray(X.T @ (weights * ~positive)).ravel()
        return np.log((p / p.sum()) / (q / q.sum())).astype(np.float32)

    def _regression(self):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(
            C=self.C, solver="liblinear", dual=True, max_iter=self.max_iter, random_state=self.seed
        )

    def fit(self, X, y, sample_weight=None) -> NaiveBayesLogisticRegression:
        """Fit on features ``X`` and labels ``y``; ``sample_weight`` (one per row) weighs both the ratio's counts
        and the regression's loss."""
        y = np.asarray(y)
        weights = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise InputError(f"NBSVM needs two or more classes in the training labels, got {self.classes_.tolist()}")
        targets = [self.classes_[1]] if len(self.classes_) == 2 else list(self.classes_)
        self.ratios_, self.regressions_ = [], []
        for target in targets:
            positive = y == target
            ratio = self._ratio(X, positive, weights)
            self.ratios_.append(ratio)
            self.regressions_.append(
                self._regression().fit(X.multiply(ratio).tocsr(), positive.astype(int), sample_weight=weights)
            )
        return self

    def predict_proba(self, X) -> np.ndarray:
        scores = np.stack(
            [
                regression.predict_proba(X.multiply(ratio).tocsr())[:, 1]
                for ratio, regression in zip(self.ratios_, self.regressions_)
            ],
            axis=1,
        )
        if len(self.classes_) == 2:
            return np.concatenate([1.0 - scores, scores], axis=1)
        return scores / np.maximum(scores.sum(axis=1, keepdims=True), 1e-12)

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(axis=1)]


@dataclass(frozen=True)
class LexicalWeights:
    """An NBSVM as arrays: its n-gram features in column order, and per regression the naive-Bayes ratio times the
    coefficients (float64, as scikit-learn computes) and the intercept. A review's logit of regression ``j`` is
    ``intercepts[j] + sum(weights[f, j] for each n-gram f it holds)``: the exact contribution of every n-gram, which
    the exported graph computes and ``make score EXPLAIN=1`` shows."""

    features: list[str]
    weights: np.ndarray  # [features, regressions]: one regression for two classes, one per class for more
    intercepts: np.ndarray  # [regressions]
    classes: np.ndarray  # the class index of each of the model's classes
    lowercase: bool
    ngram_range: tuple[int, int]


def nbsvm_weights(pipeline, purpose: str) -> LexicalWeights:
    """The NBSVM of a fitted (vectorizer, NBSVM) scikit-learn ``pipeline`` as :class:`LexicalWeights`; an error naming
    ``purpose`` for any other model (a TF-IDF baseline has no such weights)."""
    vectorizer, model = nbsvm_steps(pipeline, purpose)
    features = vectorizer.get_feature_names_out().tolist()  # in column order
    weights = np.stack(
        [
            ratio.astype(np.float64) * regression.coef_[0].astype(np.float64)
            for ratio, regression in zip(model.ratios_, model.regressions_)
        ],
        axis=1,
    )
    intercepts = np.array([regression.intercept_[0] for regression in model.regressions_], dtype=np.float64)
    return LexicalWeights(
        features,
        weights,
        intercepts,
        np.asarray(model.classes_, dtype=np.int64),
        bool(vectorizer.lowercase),
        tuple(vectorizer.ngram_range),
    )


def nbsvm_steps(pipeline, purpose: str):
    """The fitted ``(vectorizer, NBSVM)`` of the pipeline :func:`nbsvm_baseline` fits; an error naming ``purpose``
    for any other model."""
    vectorizer, model = pipeline.steps[0][1], pipeline.steps[-1][1]
    if (
        len(pipeline.steps) != 2
        or not isinstance(model, NaiveBayesLogisticRegression)
        or vectorizer.token_pattern != NBSVM_TOKEN_PATTERN
        or not vectorizer.binary
        or vectorizer.analyzer != "word"
        or vectorizer.preprocessor
        or vectorizer.tokenizer
        or vectorizer.strip_accents
        or vectorizer.stop_words
    ):
        raise InputError(
            f"{purpose}: the lexical model is not the pipeline's NBSVM (binary word n-grams, token "
            f"pattern {NBSVM_TOKEN_PATTERN!r}): only that one has per-n-gram weights"
        )
    return vectorizer, model


NBSVM_ARRAYS_FORMAT, NBSVM_ARRAYS_VERSION = "nbsvm-arrays", 1


@dataclass(frozen=True, eq=False)
class NbsvmArrays:
    """A fitted NBSVM pipeline as arrays, saved as one ``.npz`` of plain arrays (no pickle), versioned.

    Its probabilities are the pipeline's bit for bit: the same n-gram counts (:class:`NgramCounts`, built from the
    :class:`NgramVocabulary` without the vectorizer's vocabulary dict, whose unpickling is most of a ``joblib`` load)
    and the same floating-point operations in the same order. ``save`` then ``load`` gives back equal arrays.
    The file's members: ``header`` (JSON: ``format``, ``format_version``, the token count and the vectorizer's
    settings), ``tokens`` (UTF-8, joined by spaces), ``ngram_token_ids``, ``ratios``, ``coefficients``,
    ``intercepts`` and ``classes``.
    """

    vocabulary: NgramVocabulary
    ratios: np.ndarray  # [regressions, features]: the naive-Bayes log-count ratio of each regression
    coefficients: np.ndarray  # [regressions, features], float64: each logistic regression's ``coef_[0]``
    intercepts: np.ndarray  # [regressions], float64
    classes: np.ndarray  # [k], int64: the class index of each column of ``predict_proba``

    def __post_init__(self) -> None:
        regressions = 1 if len(self.classes) == 2 else len(self.classes)
        shape = (regressions, self.vocabulary.width)
        if len(self.classes) < 2 or self.ratios.shape != shape or self.coefficients.shape != shape:
            raise ValueError(
                f"{len(self.classes)} classes and {self.vocabulary.width:,} features need ratios and coefficients of "
                f"shape {shape}, got {self.ratios.shape} and {self.coefficients.shape}"
            )
        if self.intercepts.shape != (regressions,):
            raise ValueError(f"intercepts must have shape ({regressions},), got {self.intercepts.shape}")

    @classmethod
    def from_pipeline(cls, pipeline) -> NbsvmArrays:
        """The arrays of a fitted (vectorizer, NBSVM) pipeline, as :func:`nbsvm_baseline` fits and ``joblib`` saves."""
        vectorizer, model = nbsvm_steps(pipeline, "NBSVM arrays")
        return cls(
            NgramVocabulary.from_vectorizer(vectorizer),
            np.stack(model.ratios_),
            np.stack([regression.coef_[0] for regression in model.regressions_]),
            np.array([regression.intercept_[0] for regression in model.regressions_], dtype=np.float64),
            np.asarray(model.classes_, dtype=np.int64),
        )

    @cached_property
    def ngram_counts(self) -> NgramCounts:
        """The counts :meth:`predict_proba` scores (built on first use)."""
        return NgramCounts(self.vocabulary)

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """``[N, k]`` probabilities of ``texts`` (cleaned as the pipeline's were), classes in ``classes`` order."""
        return self.predict_proba_counts(self.ngram_counts.transform(list(texts)))

    def predict_proba_counts(self, counts) -> np.ndarray:
        """``[N, k]`` probabilities of the n-gram ``counts`` of :attr:`ngram_counts`."""
        from scipy.special import expit

        scores = []
        for ratio, coefficients, intercept in zip(self.ratios, self.coefficients, self.intercepts[:, None]):
            # LogisticRegression.predict_proba's steps in its order (its decision_function, then expit in place)
            logits = (counts.multiply(ratio).tocsr() @ coefficients[:, None] + intercept).reshape(-1)
            scores.append(expit(logits, out=logits))
        positive = np.stack(scores, axis=1)  # then NaiveBayesLogisticRegression.predict_proba's
        if len(self.classes) == 2:
            return np.concatenate([1.0 - positive, positive], axis=1)
        return positive / np.maximum(positive.sum(axis=1, keepdims=True), 1e-12)

    def weights(self) -> LexicalWeights:
        """The :class:`LexicalWeights` that :func:`nbsvm_weights` gives of the pipeline these arrays came from."""
        weights = np.stack(
            [ratio.astype(np.float64) * coefficients for ratio, coefficients in zip(self.ratios, self.coefficients)],
            axis=1,
        )
        return LexicalWeights(
            self.vocabulary.features(),
            weights,
            self.intercepts.copy(),
            self.classes.copy(),
            self.vocabulary.lowercase,
            self.vocabulary.ngram_range,
        )

    def save(self, path: str | Path) -> Path:
        """Write the arrays to ``path`` (a ``.npz``) through a temporary file renamed into place."""
        header = {
            "format": NBSVM_ARRAYS_FORMAT,
            "format_version": NBSVM_ARRAYS_VERSION,
            "tokens": len(self.vocabulary.tokens),
            **self.vocabulary.settings(),
        }
        arrays: dict[str, Any] = {
            "header": np.array(json.dumps(header)),
            "tokens": np.frombuffer(" ".join(self.vocabulary.tokens).encode("utf-8"), dtype=np.uint8),
            "ngram_token_ids": self.vocabulary.ngram_token_ids,
            "ratios": self.ratios,
            "coefficients": self.coefficients,
            "intercepts": self.intercepts,
            "classes": self.classes,
        }

        def write(temporary: str) -> None:
            with open(temporary, "wb") as handle:  # a file object: np.savez would add ".npz" to a name
                np.savez(handle, **arrays)

        return atomic_replace(path, write)

    @classmethod
    def load(cls, path: str | Path) -> NbsvmArrays:
        """The arrays :meth:`save` wrote to ``path``; an error naming the file where it is missing, not such a file,
        of another format version or damaged."""
        path = Path(path)
        if not path.is_file():
            raise MissingInputError(f"no NBSVM arrays file at {path}")
        try:
            with np.load(path, allow_pickle=False) as stored:
                members = {name: stored[name] for name in stored.files}
            header = json.loads(str(members["header"]))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            raise InputError(f"{path} is not a readable NBSVM arrays file ({type(error).__name__}: {error})") from error
        if not isinstance(header, dict) or header.get("format") != NBSVM_ARRAYS_FORMAT:
            raise InputError(f"{path} is not an NBSVM arrays file (its header: {header!r:.200})")
        if header.get("format_version") != NBSVM_ARRAYS_VERSION:
            raise InputError(
                f"{path} holds NBSVM arrays of format version {header.get('format_version')!r}, this code reads "
                f"version {NBSVM_ARRAYS_VERSION}: write it again from the fitted pipeline "
                "(NbsvmArrays.from_pipeline(joblib.load(...)).save(...))"
            )
        try:
            return cls._from_members(header, members)
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"{path} holds damaged NBSVM arrays ({type(error).__name__}: {error})") from error

    @classmethod
    def _from_members(cls, header: dict, members: dict[str, np.ndarray]) -> NbsvmArrays:
        text = members["tokens"].tobytes().decode("utf-8")
        tokens = tuple(text.split(" ")) if header["tokens"] else ()
        if len(tokens) != header["tokens"]:
            raise ValueError(f"{len(tokens):,} tokens where the header says {header['tokens']:,}")
        settings = {name: header[name] for name in ("lowercase", "token_pattern", "binary", "dtype")}
        vocabulary = NgramVocabulary(tokens, members["ngram_token_ids"], tuple(header["ngram_range"]), **settings)
        return cls(vocabulary, members["ratios"], members["coefficients"], members["intercepts"], members["classes"])


@dataclass(frozen=True)
class FittedBaseline:
    """A fitted lexical model, what chose its regularisation, and how long fitting took."""

    model: object  # a scikit-learn pipeline: predict_proba(texts) -> [N, k]
    params: dict  # what it is, to log
    val_accuracy_by_c: dict[float, float]
    val_accuracy: float  # of the chosen C, on the validation rows it was chosen on
    val_accuracy_cross_fitted: float  # of choosing C, without that optimism (``metrics.cross_fitted_accuracy``)
    fit_seconds: float
    # per validation row, whether the C chosen on the other half gets it right (``metrics.cross_fitted_correct``): the
    # rows behind ``val_accuracy_cross_fitted``, which a cascade's figure reads where NBSVM answers alone
    val_correct_cross_fitted: np.ndarray | None = None


def nbsvm_vectorizer(ngram_max: int = 3, max_features: int = 800_000):
    from sklearn.feature_extraction.text import CountVectorizer

    return CountVectorizer(
        ngram_range=(1, ngram_max),
        max_features=max_features,
        binary=True,
        token_pattern=NBSVM_TOKEN_PATTERN,
        dtype=np.float32,
    )


def soft_crop_rows(
    crops: pd.DataFrame, teacher: np.ndarray, label_weight: float, num_classes: int
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Training rows for sentence crops with soft labels: each crop's target is ``label_weight`` on its review's
    label plus ``1 - label_weight`` times the teacher's ``[N, k]`` probabilities, given to a weighted model as one
    row per class weighted by the target's share (rows of weight 0 left out). Returns ``(texts, labels, weights)``."""
    targets = mixed_targets(crops["label"].to_numpy(), teacher, label_weight)
    rows, classes = np.nonzero(targets > 0)
    texts = crops["text"].to_numpy()[rows].tolist()
    return texts, classes.astype(np.int64), targets[rows, classes]


def mixed_targets(labels: np.ndarray, teacher: np.ndarray, label_weight: float) -> np.ndarray:
    """``[N, k]`` soft targets: ``label_weight`` on each row's label plus ``1 - label_weight`` times the teacher's
    probabilities."""
    targets = (1.0 - label_weight) * np.asarray(teacher, dtype=np.float64)
    targets[np.arange(len(targets)), np.asarray(labels)] += label_weight
    return targets


def crop_teacher(
    train: pd.DataFrame,
    crops: pd.DataFrame,
    c_values: Sequence[float],
    ngram_max: int,
    max_features: int,
    seed: int,
    num_classes: int,
) -> np.ndarray:
    """The crops' teacher: :func:`cross_fitted_teacher` at :func:`teacher_c`."""
    return cross_fitted_teacher(train, crops, teacher_c(c_values), ngram_max, max_features, seed, num_classes)


def teacher_c(c_values: Sequence[float]) -> float:
    """The ``C`` of every crop teacher: the lower median of ``nbsvm.c_values`` (chosen before validation is)."""
    return sorted(c_values)[(len(c_values) - 1) // 2]


def cross_fitted_teacher(
    train: pd.DataFrame,
    crops: pd.DataFrame,
    c: float,
    ngram_max: int,
    max_features: int,
    seed: int,
    num_classes: int | None = None,
) -> np.ndarray:
    """NBSVM's ``[N, num_classes]`` probabilities for each crop (``review``: its row in ``train``) from a model
    fitted on the other half of the training reviews (two folds drawn with ``seed``), so no crop is scored by a model
    that read its review. Each half must hold every class of ``train``."""
    num_classes = num_classes or int(train["label"].max()) + 1
    first_fold = np.random.default_rng(seed).random(len(train)) < 0.5
    labels = train["label"].to_numpy()
    for fold in (True, False):
        if set(labels[first_fold == fold]) != set(labels):
            raise InputError(
                f"sentence crops need a teacher fitted on half of the {len(train):,} training reviews, "
                "and one half lacks a class: too few reviews per class for crops (set "
                "nbsvm.crops_per_review=0 and pseudo_label.crops_per_review=0)"
            )
    in_first = first_fold[crops["review"].to_numpy()]
    probabilities = np.zeros((len(crops), num_classes), dtype=np.float64)
    for fold in (True, False):
        vectorizer = nbsvm_vectorizer(ngram_max, max_features)
        fitted = NaiveBayesLogisticRegression(C=c, seed=seed).fit(
            vectorizer.fit_transform(train["text"][first_fold == fold]), train["label"].to_numpy()[first_fold == fold]
        )
        scored = in_first != fold  # crops of the other fold's reviews
        model = _fitted_pipeline(vectorizer, fitted)
        probabilities[scored] = class_probabilities(model, crops["text"][scored].tolist(), num_classes)
    return probabilities


def _fitted_pipeline(vectorizer, fitted):
    from sklearn.pipeline import Pipeline

    return Pipeline([("counts", vectorizer), ("nb_logistic_regression", fitted)])


@dataclass(frozen=True)
class CropRows:
    """Short texts in NBSVM's fit: crops it trains on beside the train reviews, with soft labels
    (:func:`soft_crop_rows`), and crops of the validation reviews that break ties of ``C``."""

    per_review: int = 0  # crops of each train review; their teacher cross-fitted
    label_weight: float = 0.5
    unlabeled: pd.DataFrame | None = None  # reviews without labels (``text``), e.g. IMDB's 50,000
    per_unlabeled_review: int = 0  # crops of each: "label" NBSVM's class for the whole review
    validation: pd.DataFrame | None = None  # crops of the validation reviews (``text``, ``label``): ties of C

    @property
    def unlabeled_reviews(self) -> int:  # how many unlabeled reviews are cropped
        return len(self.unlabeled) if self.unlabeled is not None and self.per_unlabeled_review else 0


def pseudo_labelled_crop_rows(
    teacher, unlabeled: pd.DataFrame, per_review: int, label_weight: float, seed: int, num_classes: int
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Training rows (:func:`soft_crop_rows`) for ``per_review`` crops of every unlabeled review: a crop's label is
    ``teacher``'s class for its whole review (the crop alone is often neutral), mixed with its probability on it."""
    review_class = class_probabilities(teacher, unlabeled["text"].tolist(), num_classes).argmax(axis=1)
    crops = sentence_crops(unlabeled[["text"]].assign(label=review_class), seed, per_review)
    return soft_crop_rows(
        crops, class_probabilities(teacher, crops["text"].tolist(), num_classes), label_weight, num_classes
    )


def _chosen_c(fitted: dict, accuracy: dict[float, float], vectorizer, val_crops: pd.DataFrame | None) -> float:
    """The ``C`` of the best validation accuracy; of equals, the best on ``val_crops`` when given, then the
    smallest (max keeps the first of equals)."""
    tied = [c for c in sorted(accuracy) if accuracy[c] == max(accuracy.values())]
    if val_crops is None or len(tied) == 1:
        return tied[0]
    features, labels = vectorizer.transform(val_crops["text"]), val_crops["label"].to_numpy()
    return max(tied, key=lambda c: (fitted[c].predict(features) == labels).mean())


def _silent(line: str) -> None:
    pass


def _estimate(seconds: list[float], remaining: int) -> str:
    """What a fit of ``C`` says of the time left, from the fits so far (``seconds``, smallest ``C`` first): each fit
    still to run as long as the last one times the growth from the one before it (liblinear takes longer as ``C``
    grows: 15, 20, 49 and 149 s for 0.03 to 1 on IMDB with its crops), the last one's time after a single fit."""
    if not seconds:
        return ""
    growth = max(1.0, seconds[-1] / seconds[-2]) if len(seconds) > 1 and seconds[-2] > 0 else 1.0
    return f", about {duration(sum(seconds[-1] * growth**step for step in range(1, remaining + 1)))} left"


def _fit_each_c(
    features,
    labels: np.ndarray,
    weights: np.ndarray | None,
    val_features,
    val_labels: np.ndarray,
    c_values: Sequence[float],
    seed: int,
    progress: Callable[[str], None],
) -> tuple[dict, dict, dict]:
    """An NBSVM per ``C``, smallest first: ``(fitted, validation accuracy, validation rows right)`` by ``C``."""
    fitted: dict[float, NaiveBayesLogisticRegression] = {}
    accuracy: dict[float, float] = {}
    correct: dict[float, np.ndarray] = {}
    seconds: list[float] = []
    for index, c in enumerate(sorted(c_values)):
        progress(
            f"C {c:g} [{index + 1}/{len(c_values)}] on {features.shape[0]:,} rows"
            + _estimate(seconds, len(c_values) - index)
        )
        began = time.perf_counter()
        fitted[c] = NaiveBayesLogisticRegression(C=c, seed=seed).fit(features, labels, weights)
        correct[c] = fitted[c].predict(val_features) == val_labels
        accuracy[c] = float(correct[c].mean())
        seconds.append(time.perf_counter() - began)
    return fitted, accuracy, correct


def nbsvm_baseline(
    train: pd.DataFrame,
    val: pd.DataFrame,
    c_values: Sequence[float] = (0.1,),
    ngram_max: int = 3,
    max_features: int = 800_000,
    seed: int = 0,
    crops: CropRows = CropRows(),
    progress: Callable[[str], None] = _silent,
) -> FittedBaseline:
    """NBSVM fitted on ``train`` (``text``, ``label``), its ``C`` the best of ``c_values`` on ``val``.

    The vectorizer is fitted once on the train reviews; each ``C`` refits only the regression. Ties go to the
    smaller ``C``, or with ``crops.validation`` to the ``C`` best on those crops, then the smaller. With ``crops``
    (:class:`CropRows`) the regression and the naive-Bayes ratio also read crops of the train reviews (drawn with
    ``seed``, their teacher cross-fitted) and of unlabeled reviews (``seed + 1``, :func:`pseudo_labelled_crop_rows`;
    the teacher at :func:`teacher_c` on every train review). ``progress`` gets a line as each step starts (a fit on
    IMDB with crops takes minutes): what it does and, from the second ``C`` on, an estimate of what is left.
    """
    from scipy import sparse

    if not c_values:
        raise ConfigError("nbsvm.c_values needs at least one value")
    started = time.perf_counter()
    progress(f"1-{ngram_max}-gram counts of {len(train):,} train reviews")
    vectorizer = nbsvm_vectorizer(ngram_max, max_features)
    train_features = vectorizer.fit_transform(train["text"])
    labels, num_classes = train["label"].to_numpy(), int(train["label"].max()) + 1
    parts = []  # (texts, labels, weights) per kind of crop
    if crops.per_review:
        progress(f"{crops.per_review} crops of each train review, labelled by NBSVMs fitted on each half")
        own = sentence_crops(train, seed, crops.per_review)
        parts.append(
            soft_crop_rows(
                own,
                crop_teacher(train, own, c_values, ngram_max, max_features, seed, num_classes),
                crops.label_weight,
                num_classes,
            )
        )
    if crops.unlabeled_reviews:
        progress(
            f"{crops.per_unlabeled_review} crops of each of {crops.unlabeled_reviews:,} unlabeled reviews, "
            "labelled by an NBSVM fitted on the train reviews"
        )
        teacher = _fitted_pipeline(
            vectorizer, NaiveBayesLogisticRegression(C=teacher_c(c_values), seed=seed).fit(train_features, labels)
        )  # every train review: the unlabeled ones are not among them
        parts.append(
            pseudo_labelled_crop_rows(
                teacher, crops.unlabeled, crops.per_unlabeled_review, crops.label_weight, seed + 1, num_classes
            )
        )
    weights = None
    if parts:
        progress(f"n-gram counts of {sum(len(texts) for texts, _, _ in parts):,} crop rows")
        train_features = sparse.vstack([train_features, *(vectorizer.transform(texts) for texts, _, _ in parts)])
        labels = np.concatenate([labels, *(part[1] for part in parts)])
        weights = np.concatenate([np.ones(len(train)), *(part[2] for part in parts)])
    fitted, accuracy, correct = _fit_each_c(
        train_features.tocsr(),
        labels,
        weights,
        vectorizer.transform(val["text"]),
        val["label"].to_numpy(),
        c_values,
        seed,
        progress,
    )
    best = _chosen_c(fitted, accuracy, vectorizer, crops.validation)
    from pipeline.metrics import cross_fitted_correct

    honest_rows = cross_fitted_correct(correct)

    params = {
        "nbsvm.ngram_range": f"1,{ngram_max}",
        "nbsvm.max_features": max_features,
        "nbsvm.C": best,
        "nbsvm.C_grid": ",".join(f"{c:g}" for c in sorted(c_values)),
        "nbsvm.vocabulary": len(vectorizer.vocabulary_),
        **_crop_params(crops),
    }
    return FittedBaseline(
        _fitted_pipeline(vectorizer, fitted[best]),
        params,
        accuracy,
        accuracy[best],
        float(honest_rows.sum() / len(honest_rows)),  # as metrics.cross_fitted_accuracy
        time.perf_counter() - started,
        honest_rows,
    )


def _crop_params(crops: CropRows) -> dict:
    """What an NBSVM run logs of itself beside its n-grams and C: the model and what it read besides the reviews."""
    unlabeled = crops.unlabeled_reviews
    params = {
        "model": "nbsvm",
        "nbsvm.binary": True,
        "nbsvm.token_pattern": NBSVM_TOKEN_PATTERN,
        "nbsvm.crops_per_review": crops.per_review,
        "nbsvm.unlabeled_crops_per_review": crops.per_unlabeled_review if unlabeled else 0,
        "nbsvm.unlabeled_reviews": unlabeled,
    }
    if crops.per_review or unlabeled:
        params["nbsvm.crop_label_weight"] = crops.label_weight
    if crops.validation is not None:
        params["nbsvm.C_ties"] = "best on the validation crops"
    return params


TFIDF_NGRAM_RANGE, TFIDF_MIN_DF, TFIDF_MAX_FEATURES, TFIDF_C = (1, 2), 2, 300_000, 4.0


def tfidf_baseline(train: pd.DataFrame, seed: int):
    """TF-IDF (1-2 grams) + logistic regression fitted on the train split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(
            ngram_range=TFIDF_NGRAM_RANGE, min_df=TFIDF_MIN_DF, max_features=TFIDF_MAX_FEATURES, sublinear_tf=True
        ),
        LogisticRegression(C=TFIDF_C, max_iter=2000, random_state=seed),
    )
    return model.fit(train["text"], train["label"])


def class_probabilities(model, texts: Sequence[str], num_classes: int) -> np.ndarray:
    """``model.predict_proba(texts)`` placed in ``[N, num_classes]`` by class index (a class the model never
    saw in training gets probability 0)."""
    probabilities = np.zeros((len(texts), num_classes), dtype=np.float32)
    if len(texts):
        probabilities[:, np.asarray(model.classes_, dtype=int)] = model.predict_proba(list(texts))
    return probabilities
