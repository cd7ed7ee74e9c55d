"""The fast n-gram counts the lexical models score with: the vectorizer's matrix exactly."""

import pytest
from sklearn.feature_extraction.text import CountVectorizer

from pipeline.text.ngram_counts import NgramCounts
from tests.test_lexical import reviews


@pytest.mark.parametrize("ngram_max", [1, 3])
def test_fast_ngram_counts_are_the_vectorizers_matrix_exactly(ngram_max):
    from pipeline.lexical import nbsvm_vectorizer

    train = reviews(120, 8)["text"].tolist() + ["Straße café naïve! Really?! ok", "x_y 3rd 42 films!!"]
    vectorizer = nbsvm_vectorizer(ngram_max=ngram_max, max_features=3000).fit(train)
    texts = reviews(40, 9)["text"].tolist() + [
        "",
        "!!!",
        "unknownword superb film",
        "STRASSE Straße café! naïve?",
        "superb",
        "a\nfilm\tsuperb",
        "the film the film the film",
        "é",
        "ΔΔ Ωmega superb",
    ]
    expected, got = vectorizer.transform(texts), NgramCounts(vectorizer).transform(texts)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert (got != expected).nnz == 0
    assert got.nnz > 0


def test_fast_ngram_counts_refuse_a_vectorizer_they_do_not_mirror():
    with pytest.raises(ValueError, match="word-analyzer"):
        NgramCounts(CountVectorizer(analyzer="char").fit(["abc"]))
