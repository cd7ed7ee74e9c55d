"""The bag-of-words model the Transformer is measured against, and the teacher of ``make pseudo-label``."""

from __future__ import annotations

import pandas as pd


def tfidf_baseline(train: pd.DataFrame, seed: int):
    """TF-IDF (1-2 grams) + logistic regression fitted on the train split.

    Its ``predict_proba(texts)`` gives ``[N, k]`` in class-index order, like the Transformer's.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, max_features=300_000, sublinear_tf=True),
        LogisticRegression(C=4.0, max_iter=2000, random_state=seed),
    )
    return model.fit(train["text"], train["label"])
