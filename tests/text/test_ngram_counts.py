"""The fast n-gram counts the lexical models score with: the vectorizer's matrix exactly, from the fitted vectorizer
or from its arrays (``NgramVocabulary``)."""

import numpy as np
import pytest
from sklearn.feature_extraction.text import CountVectorizer

from pipeline.text.ngram_counts import NgramCounts, NgramVocabulary
from tests.test_lexical import reviews


@pytest.mark.parametrize("from_arrays", [False, True], ids=["vectorizer", "arrays"])
@pytest.mark.parametrize("ngram_max", [1, 3])
def test_fast_ngram_counts_are_the_vectorizers_matrix_exactly(ngram_max, from_arrays):
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
    counts = NgramCounts(NgramVocabulary.from_vectorizer(vectorizer) if from_arrays else vectorizer)
    expected, got = vectorizer.transform(texts), counts.transform(texts)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert (got != expected).nnz == 0
    assert got.nnz > 0


def test_the_arrays_name_the_vectorizers_features_in_column_order():
    vectorizer = CountVectorizer(ngram_range=(1, 3), binary=True).fit(["a b c d", "b c a", "Café naïve c"])
    vocabulary = NgramVocabulary.from_vectorizer(vectorizer)
    assert vocabulary.features() == vectorizer.get_feature_names_out().tolist()
    assert vocabulary.width == len(vectorizer.vocabulary_) and vocabulary.ngram_token_ids.shape[1] == 3


def test_fast_ngram_counts_refuse_a_vectorizer_they_do_not_mirror():
    with pytest.raises(ValueError, match="word-analyzer"):
        NgramCounts(CountVectorizer(analyzer="char").fit(["abc"]))
    with pytest.raises(ValueError, match="stop words"):  # sklearn forms n-grams across a dropped stop word
        NgramCounts(CountVectorizer(ngram_range=(1, 2), stop_words=["b"]).fit(["a b c"]))


@pytest.mark.parametrize(
    "ids, message",
    [
        ([[0, -1], [0, -1]], "holds a 1-gram twice"),
        ([[0, 2], [1, -1]], r"must lie in \[-1, 2\)"),
        ([[-1, 0], [1, -1]], "1 to 2 token ids, then -1s"),
        ([[0, 1, -1]], r"shape \[columns, 2\]"),
    ],
)
def test_arrays_that_are_not_one_vectorizer_s_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        NgramCounts(NgramVocabulary(("a", "b"), np.array(ids), (1, 2), True, r"\w+", True, "float32"))
