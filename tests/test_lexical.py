"""The lexical models: NBSVM's arithmetic, its choice of C on validation, and its pyfunc model's answers."""

import random

import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from pipeline.lexical import (
    CropRows,
    NaiveBayesLogisticRegression,
    class_probabilities,
    nbsvm_baseline,
    tfidf_baseline,
)
from pipeline.model.classifiers import LexicalClassifier, SentimentClassifier
from pipeline.text.conventions import text_problem
from tests.conftest import make_review

ROWS = ["A superb, wonderful film.", "", "   ", "42", None, "Awful and dull.", "caf\udce9 broken bytes"]


def reviews(count: int, seed: int, classes: int = 2) -> pd.DataFrame:
    rng = random.Random(seed)
    labels = [i % classes for i in range(count)]
    texts = [make_review(rng, label % 2) + (" third" * 3 if label == 2 else "") for label in labels]
    return pd.DataFrame({"text": texts, "label": labels})


def test_the_log_count_ratio_is_naive_bayes_on_binary_counts():
    X = sparse.csr_matrix(np.array([[1, 0, 1], [1, 0, 0], [0, 1, 1], [0, 1, 0]], dtype=np.float32))
    y = np.array([1, 1, 0, 0])
    model = NaiveBayesLogisticRegression(C=1.0).fit(X, y)
    p, q = 1 + np.array([2, 0, 1]), 1 + np.array([0, 2, 1])  # add-one counts in class 1 and class 0
    np.testing.assert_allclose(model.ratios_[0], np.log((p / p.sum()) / (q / q.sum())), rtol=1e-6)
    probabilities = model.predict_proba(X)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)
    assert (probabilities.argmax(axis=1) == y).all()


def test_three_classes_get_one_ratio_each_and_probabilities_that_sum_to_one():
    train, val = reviews(300, 0, classes=3), reviews(90, 1, classes=3)
    fitted = nbsvm_baseline(train, val, c_values=(0.1, 1.0), max_features=2000)
    probabilities = class_probabilities(fitted.model, val["text"].tolist(), 3)
    assert probabilities.shape == (90, 3) and len(fitted.model.steps[-1][1].ratios_) == 3
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert (probabilities.argmax(axis=1) == val["label"].to_numpy()).mean() > 0.9


def test_c_is_chosen_on_validation_with_ties_going_to_the_stronger_regularisation():
    train, val = reviews(200, 2), reviews(60, 3)
    fitted = nbsvm_baseline(train, val, c_values=(1.0, 0.3, 0.03))
    assert set(fitted.val_accuracy_by_c) == {0.03, 0.3, 1.0}
    best = max(fitted.val_accuracy_by_c.values())
    assert fitted.params["nbsvm.C"] == min(c for c, a in fitted.val_accuracy_by_c.items() if a == best)
    assert fitted.val_accuracy == best and fitted.model.steps[-1][1].C == fitted.params["nbsvm.C"]
    with pytest.raises(ValueError, match="at least one value"):
        nbsvm_baseline(train, val, c_values=())


def test_nbsvm_beats_chance_where_tfidf_does_too_and_needs_two_classes():
    train, test = reviews(200, 4), reviews(80, 5)
    nbsvm = nbsvm_baseline(train, test, c_values=(0.1,)).model
    tfidf = tfidf_baseline(train, seed=0)
    for model in (nbsvm, tfidf):
        assert (class_probabilities(model, test["text"].tolist(), 2).argmax(axis=1) == test["label"]).mean() > 0.9
    with pytest.raises(ValueError, match="two or more classes"):
        NaiveBayesLogisticRegression().fit(sparse.csr_matrix(np.ones((3, 2))), np.array([1, 1, 1]))


@pytest.fixture(scope="module")
def lexical_model(tmp_path_factory):
    import joblib

    from pipeline.core.files import atomic_write_json

    folder = tmp_path_factory.mktemp("lexical")
    fitted = nbsvm_baseline(reviews(200, 6), reviews(60, 7), c_values=(0.1,))
    joblib.dump(fitted.model, folder / "nbsvm.joblib")
    atomic_write_json(folder / "labels.json", {"labels": ["negative", "positive"]})
    return folder, fitted


def test_the_lexical_pyfunc_answers_like_the_transformer_does_row_for_row(lexical_model):
    folder, fitted = lexical_model
    classifier = LexicalClassifier.from_paths(folder / "nbsvm.joblib", folder)
    scored = classifier.predict(None, pd.DataFrame({"text": pd.Series(ROWS, dtype=object)}))
    assert list(scored.columns) == ["positive_probability", "predicted_label", "score_error"]
    assert scored["score_error"].tolist() == [text_problem(text) for text in ROWS]
    kept = [i for i, text in enumerate(ROWS) if not text_problem(text)]
    expected = class_probabilities(fitted.model, [ROWS[i] for i in kept], 2)[:, 1]
    np.testing.assert_allclose(scored["positive_probability"].iloc[kept].astype(float), expected, rtol=1e-5)
    assert scored["predicted_label"].iloc[kept].tolist() == ["positive", "negative"]
    assert all(scored["positive_probability"].iloc[i] is None for i in range(len(ROWS)) if i not in kept)
    assert not isinstance(classifier, SentimentClassifier) and classifier.kind == "nbsvm"


def test_the_lexical_pyfunc_cleans_texts_as_ingestion_does(lexical_model):
    folder, _ = lexical_model
    classifier = LexicalClassifier.from_paths(folder / "nbsvm.joblib", folder)
    raw = "Wonderful<br /><br />superb film"
    np.testing.assert_allclose(classifier.probabilities([raw]), classifier.probabilities(["Wonderful superb film"]))


def test_sample_weights_count_a_row_as_often_as_its_weight():
    X = sparse.csr_matrix(np.array([[1, 0, 1], [1, 0, 0], [0, 1, 1], [0, 1, 0]], dtype=np.float32))
    y = np.array([1, 1, 0, 0])
    twice = NaiveBayesLogisticRegression(C=1.0).fit(sparse.vstack([X, X[:1]]).tocsr(), np.r_[y, 1])
    weighted = NaiveBayesLogisticRegression(C=1.0).fit(X, y, sample_weight=np.array([2.0, 1, 1, 1]))
    np.testing.assert_allclose(weighted.ratios_[0], twice.ratios_[0], rtol=1e-6)
    np.testing.assert_allclose(weighted.predict_proba(X), twice.predict_proba(X), atol=1e-4)
    unweighted = NaiveBayesLogisticRegression(C=1.0).fit(X, y)
    ones = NaiveBayesLogisticRegression(C=1.0).fit(X, y, sample_weight=np.ones(4))
    np.testing.assert_allclose(ones.predict_proba(X), unweighted.predict_proba(X), atol=1e-6)


def test_soft_crop_rows_mix_the_review_label_with_the_teacher():
    from pipeline.lexical import soft_crop_rows

    crops = pd.DataFrame({"text": ["good", "bad"], "label": [1, 0], "review": [0, 1]})
    teacher = np.array([[0.2, 0.8], [0.4, 0.6]])
    texts, labels, weights = soft_crop_rows(crops, teacher, 0.5, 2)
    assert texts == ["good", "good", "bad", "bad"] and labels.tolist() == [0, 1, 0, 1]
    np.testing.assert_allclose(weights, [0.1, 0.9, 0.7, 0.3])
    texts, labels, weights = soft_crop_rows(crops, teacher, 1.0, 2)  # hard labels: one row each
    assert texts == ["good", "bad"] and labels.tolist() == [1, 0] and weights.tolist() == [1.0, 1.0]


def test_the_teacher_never_scores_a_crop_with_a_model_that_read_its_review():
    from pipeline.lexical import cross_fitted_teacher
    from pipeline.text.crops import sentence_crops

    train = reviews(120, 8)
    # every review names itself: a model that read review i knows the word "only<i>" and its label
    train["text"] = [f"only{i} only{i} only{i}. {text}" for i, text in enumerate(train["text"])]
    crops = sentence_crops(train, seed=0, per_review=2)
    teacher = cross_fitted_teacher(train, crops, c=1.0, ngram_max=1, max_features=5000, seed=0)
    np.testing.assert_allclose(teacher.sum(axis=1), 1.0, rtol=1e-6)
    own_word = crops["text"].str.startswith("only").to_numpy()
    named = pd.DataFrame(
        {"text": [f"only{i} only{i} only{i}." for i in range(120)], "label": train["label"], "review": range(120)}
    )
    blind = cross_fitted_teacher(train, named, c=1.0, ngram_max=1, max_features=5000, seed=0)
    # a review's own word is unknown to the model that scores it: each fold's model gives all of them its intercept
    # alone, so two values in all (a model that had read them would tell the labels apart)
    assert len(np.unique(blind[:, 1].round(6))) <= 2
    assert own_word.any()


def test_crops_in_training_keep_reviews_and_help_on_single_sentences():
    from pipeline.text.crops import sentence_crops

    rng = random.Random(9)

    def mixed(count: int) -> pd.DataFrame:  # each review: several neutral sentences and one that carries its label
        labels = [i % 2 for i in range(count)]
        texts = [
            " ".join(
                rng.sample(
                    ["The film runs two hours.", "It was shown in May.", "I saw it twice.", "The cinema was full."], 3
                )
                + [
                    rng.choice(
                        ["Superb and moving.", "A wonderful film."] if label else ["Awful and dull.", "A tedious mess."]
                    )
                ]
            )
            for label in labels
        ]
        return pd.DataFrame({"text": texts, "label": labels})

    train, val, test = mixed(300), mixed(100), mixed(200)
    plain = nbsvm_baseline(train, val, c_values=(0.1,), ngram_max=2)
    cropped = nbsvm_baseline(train, val, c_values=(0.1,), ngram_max=2, crops=CropRows(4))
    assert cropped.params["nbsvm.crops_per_review"] == 4 and cropped.params["nbsvm.crop_label_weight"] == 0.5
    for fitted in (plain, cropped):
        assert (
            class_probabilities(fitted.model, test["text"].tolist(), 2).argmax(axis=1) == test["label"]
        ).mean() > 0.95
    sentences = sentence_crops(test, seed=1, per_review=1)
    labelled = sentences[sentences["text"].str.contains("Superb|wonderful|Awful|tedious")]

    for fitted in (plain, cropped):  # right on every sentence that carries the label
        assert (
            class_probabilities(fitted.model, labelled["text"].tolist(), 2).argmax(axis=1) == labelled["label"]
        ).all()
    # the crops were read: same vocabulary, other ratios and weights
    assert plain.params["nbsvm.vocabulary"] == cropped.params["nbsvm.vocabulary"]
    assert not np.allclose(plain.model.steps[-1][1].ratios_[0], cropped.model.steps[-1][1].ratios_[0])


def test_crops_need_every_class_in_both_halves_of_the_teacher():
    train = reviews(40, 10)
    train = pd.concat([train[train["label"] == 0], train[train["label"] == 1].head(1)], ignore_index=True)
    with pytest.raises(ValueError, match="one half lacks a class.*nbsvm.crops_per_review=0"):
        nbsvm_baseline(train, reviews(20, 11), c_values=(0.1,), crops=CropRows(1))


def test_crops_of_unlabeled_reviews_carry_their_whole_review_s_class():
    """A sentence that is neutral in the labelled reviews but only ever stands beside praise (or scorn) in the
    unlabeled ones takes that side once the unlabeled reviews' crops are read: each crop is labelled with the class
    the teacher gives its whole review, which the crop alone does not show."""
    rng = random.Random(4)
    verdicts = {1: ["Superb and moving.", "A wonderful film."], 0: ["Awful and dull.", "A tedious mess."]}
    asides = {1: "Zorbly was the producer.", 0: "Quibble was the producer."}

    def labelled(count: int) -> pd.DataFrame:  # both asides in both classes: neutral here
        labels = [i % 2 for i in range(count)]
        texts = [f"{rng.choice(verdicts[label])} {asides[rng.randrange(2)]}" for label in labels]
        return pd.DataFrame({"text": texts, "label": labels})

    # unlabeled: the verdict and the aside of the same side, the aside a sentence of its own
    unlabeled = pd.DataFrame({"text": [f"{rng.choice(verdicts[i % 2])} {asides[i % 2]}" for i in range(400)]})
    train, val = labelled(200), labelled(60)
    plain = nbsvm_baseline(train, val, c_values=(0.1,), ngram_max=2, crops=CropRows(0, 0.5, unlabeled, 0))
    taught = nbsvm_baseline(train, val, c_values=(0.1,), ngram_max=2, crops=CropRows(0, 0.5, unlabeled, 2))
    assert plain.params["nbsvm.unlabeled_reviews"] == 0 and plain.params["nbsvm.unlabeled_crops_per_review"] == 0
    assert taught.params["nbsvm.unlabeled_reviews"] == 400 and taught.params["nbsvm.unlabeled_crops_per_review"] == 2
    aside_texts = [asides[1], asides[0]]
    before = class_probabilities(plain.model, aside_texts, 2)[:, 1]
    after = class_probabilities(taught.model, aside_texts, 2)[:, 1]
    assert abs(before[0] - before[1]) < 0.1  # neutral from the labelled reviews alone
    assert after[0] > 0.6 and after[1] < 0.4  # each aside on its verdict's side
    # the verdicts are still read right, and the same seed gives the same model
    assert (class_probabilities(taught.model, val["text"].tolist(), 2).argmax(axis=1) == val["label"]).all()
    again = nbsvm_baseline(train, val, c_values=(0.1,), ngram_max=2, crops=CropRows(0, 0.5, unlabeled, 2))
    np.testing.assert_array_equal(again.model.steps[-1][1].ratios_[0], taught.model.steps[-1][1].ratios_[0])


def test_equal_validation_accuracies_go_to_the_c_better_on_the_validation_crops():
    from sklearn.feature_extraction.text import CountVectorizer

    from pipeline.lexical import _chosen_c

    class Fixed:  # a fitted model that answers one class whatever it reads
        def __init__(self, label: int):
            self.label = label

        def predict(self, features):
            return np.full(features.shape[0], self.label)

    vectorizer = CountVectorizer().fit(["good bad"])
    crops = pd.DataFrame({"text": ["good", "good", "bad"], "label": [1, 1, 0]})
    fitted = {0.03: Fixed(0), 0.1: Fixed(1), 1.0: Fixed(1)}
    assert _chosen_c(fitted, {0.03: 0.9, 0.1: 0.9, 1.0: 0.8}, vectorizer, crops) == 0.1  # 2 of 3 crops against 1
    assert _chosen_c(fitted, {0.03: 0.9, 0.1: 0.9, 1.0: 0.8}, vectorizer, None) == 0.03  # no crops: the smaller
    assert _chosen_c(fitted, {0.03: 0.9, 0.1: 0.8, 1.0: 0.9}, vectorizer, crops) == 1.0  # only the tied compete
    assert _chosen_c(fitted, {0.03: 0.95, 0.1: 0.9, 1.0: 0.9}, vectorizer, crops) == 0.03  # no tie: reviews decide


def test_a_fit_says_each_step_as_it_starts_and_from_the_second_c_on_what_is_left():
    train, val = reviews(120, 12), reviews(40, 13)
    unlabeled = reviews(30, 14)[["text"]]
    val_crops = pd.DataFrame({"text": ["Superb.", "Awful."], "label": [1, 0]})
    lines = []
    fitted = nbsvm_baseline(
        train,
        val,
        c_values=(1.0, 0.1, 0.3),
        ngram_max=2,
        seed=3,
        crops=CropRows(2, 0.5, unlabeled, 3, val_crops),
        progress=lines.append,
    )
    assert lines[:3] == [
        "1-2-gram counts of 120 train reviews",
        "2 crops of each train review, labelled by NBSVMs fitted on each half",
        "3 crops of each of 30 unlabeled reviews, labelled by an NBSVM fitted on the train reviews",
    ]
    crop_rows = int(lines[3].split()[3].replace(",", ""))
    assert lines[3] == f"n-gram counts of {crop_rows:,} crop rows" and 2 * 120 + 3 * 30 <= crop_rows <= 2 * (330)
    assert lines[4] == f"C 0.1 [1/3] on {120 + crop_rows:,} rows"  # nothing finished: no estimate yet
    assert lines[5].startswith(f"C 0.3 [2/3] on {120 + crop_rows:,} rows, about ") and lines[5].endswith(" left")
    assert lines[6].startswith("C 1 [3/3] on ") and len(lines) == 7
    assert fitted.params["nbsvm.C_ties"] == "best on the validation crops"
    quiet = nbsvm_baseline(train, val, c_values=(0.1,), ngram_max=2, seed=3)  # silent by default; ties by C alone
    assert "nbsvm.C_ties" not in quiet.params


def test_the_time_left_grows_with_c_as_the_fits_so_far_did():
    from pipeline.lexical import _estimate

    assert _estimate([], 4) == ""
    assert _estimate([10.0], 3) == ", about 0m30s left"  # one fit: each still to run as long
    assert _estimate([15.0, 20.0, 49.0], 1) == ", about 2m00s left"  # 49 s times 49/20 (IMDB's last C took 149 s)
    assert _estimate([20.0, 30.0], 2) == ", about 1m52s left"  # 45 s, then 67.5 s: 112.5 s
    assert _estimate([30.0, 20.0], 2) == ", about 0m40s left"  # never shrinking: as long as the last
