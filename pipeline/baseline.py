"""The lexical models the Transformer is measured against, fused with, and taught by.

- :func:`nbsvm_baseline`: NBSVM (Wang & Manning 2012) in the fastai form: binary 1-3-gram counts
  scaled by the naive-Bayes log-count ratio ``r``, then a liblinear logistic regression. Its
  regularisation ``C`` is chosen on the validation split from ``baseline.nbsvm_c``; the vectorizer,
  ``r`` and the regression are fitted on the train split only. It is the comparison's baseline, a
  candidate for ``@champion``, the lexical half of every fused model and the teacher of
  ``make pseudo-label``.
- :func:`tfidf_baseline`: TF-IDF (1-2 grams) + logistic regression, the earlier baseline, kept as a
  second reference row.

Both give ``predict_proba(texts)`` as ``[N, k]`` in class-index order, like the Transformer. Texts are
expected cleaned (``pipeline.text.clean_text``), as ingestion stores them and the pyfunc models pass them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin

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

    def _ratio(self, X, positive: np.ndarray) -> np.ndarray:
        p = self.alpha + np.asarray(X[positive].sum(axis=0)).ravel()
        q = self.alpha + np.asarray(X[~positive].sum(axis=0)).ravel()
        return np.log((p / p.sum()) / (q / q.sum())).astype(np.float32)

    def _regression(self):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=self.C, solver="liblinear", dual=True, max_iter=self.max_iter,
                                  random_state=self.seed)

    def fit(self, X, y) -> "NaiveBayesLogisticRegression":
        y = np.asarray(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(f"NBSVM needs two or more classes in the training labels, got {self.classes_.tolist()}")
        targets = [self.classes_[1]] if len(self.classes_) == 2 else list(self.classes_)
        self.ratios_, self.regressions_ = [], []
        for target in targets:
            positive = y == target
            ratio = self._ratio(X, positive)
            self.ratios_.append(ratio)
            self.regressions_.append(self._regression().fit(X.multiply(ratio).tocsr(), positive.astype(int)))
        return self

    def predict_proba(self, X) -> np.ndarray:
        scores = np.stack([regression.predict_proba(X.multiply(ratio).tocsr())[:, 1]
                           for ratio, regression in zip(self.ratios_, self.regressions_)], axis=1)
        if len(self.classes_) == 2:
            return np.concatenate([1.0 - scores, scores], axis=1)
        return scores / np.maximum(scores.sum(axis=1, keepdims=True), 1e-12)

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(axis=1)]



@dataclass(frozen=True)
class FittedBaseline:
    """A fitted lexical model, what chose its regularisation, and how long fitting took."""

    model: object                        # a scikit-learn pipeline: predict_proba(texts) -> [N, k]
    params: dict                         # what it is, to log
    val_accuracy_by_c: dict[float, float]
    val_accuracy: float
    fit_seconds: float


def nbsvm_vectorizer(ngram_max: int = 3, max_features: int = 800_000):
    from sklearn.feature_extraction.text import CountVectorizer

    return CountVectorizer(ngram_range=(1, ngram_max), max_features=max_features, binary=True,
                           token_pattern=NBSVM_TOKEN_PATTERN, dtype=np.float32)


def nbsvm_baseline(train: pd.DataFrame, val: pd.DataFrame, c_values: Sequence[float] = (0.1,),
                   ngram_max: int = 3, max_features: int = 800_000, seed: int = 0) -> FittedBaseline:
    """NBSVM fitted on ``train`` (``text``, ``label``), its ``C`` the best of ``c_values`` on ``val``.

    The vectorizer is fitted once on train; each ``C`` refits only the regression. Ties go to the
    smaller ``C`` (the stronger regularisation).
    """
    import time

    from sklearn.pipeline import Pipeline

    if not c_values:
        raise ValueError("baseline.nbsvm_c needs at least one value")
    started = time.perf_counter()
    vectorizer = nbsvm_vectorizer(ngram_max, max_features)
    train_features = vectorizer.fit_transform(train["text"])
    val_features = vectorizer.transform(val["text"])
    train_labels, val_labels = train["label"].to_numpy(), val["label"].to_numpy()
    fitted, accuracy = {}, {}
    for c in sorted(c_values):
        fitted[c] = NaiveBayesLogisticRegression(C=c, seed=seed).fit(train_features, train_labels)
        accuracy[c] = float((fitted[c].predict(val_features) == val_labels).mean())
    best = max(sorted(accuracy), key=lambda c: accuracy[c])  # max keeps the first (smallest) of equals
    model = Pipeline([("counts", vectorizer), ("nb_logistic_regression", fitted[best])])
    params = {"model": "nbsvm", "nbsvm.ngram_range": f"1,{ngram_max}", "nbsvm.max_features": max_features,
              "nbsvm.binary": True, "nbsvm.token_pattern": NBSVM_TOKEN_PATTERN, "nbsvm.C": best,
              "nbsvm.C_grid": ",".join(f"{c:g}" for c in sorted(c_values)),
              "nbsvm.vocabulary": len(vectorizer.vocabulary_)}
    return FittedBaseline(model, params, accuracy, accuracy[best], time.perf_counter() - started)


def tfidf_baseline(train: pd.DataFrame, seed: int):
    """TF-IDF (1-2 grams) + logistic regression fitted on the train split."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, max_features=300_000, sublinear_tf=True),
        LogisticRegression(C=4.0, max_iter=2000, random_state=seed),
    )
    return model.fit(train["text"], train["label"])


def class_probabilities(model, texts: Sequence[str], num_classes: int) -> np.ndarray:
    """``model.predict_proba(texts)`` placed in ``[N, num_classes]`` by class index (a class the model never
    saw in training gets probability 0)."""
    probabilities = np.zeros((len(texts), num_classes), dtype=np.float32)
    if len(texts):
        probabilities[:, np.asarray(model.classes_, dtype=int)] = model.predict_proba(list(texts))
    return probabilities
