"""Explanations: NBSVM's exact n-gram contributions, integrated gradients' completeness, the fusion's weighting and
the column's text."""

import joblib
import keras
import numpy as np
import pytest

from pipeline.config import ModelConfig
from pipeline.core.errors import InputError
from pipeline.core.files import atomic_write_json
from pipeline.core.predictions import fuse_probabilities
from pipeline.lexical import nbsvm_baseline, tfidf_baseline
from pipeline.model.classifiers import LexicalClassifier
from pipeline.model.explain import (
    Explanation,
    explanation_text,
    fused_explanation,
    integrated_gradients,
    lexical_explanations,
    log_odds,
    word_attributions,
)
from pipeline.model.transformer import build_model
from pipeline.text.conventions import clean_text
from tests.test_lexical import reviews

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "##s", "not", "plot"] + [
    f"w{i}" for i in range(49)
]

# Integrated gradients' midpoint sum over 16 points: its attributions add up to the log-odds difference within this
# (absolute, in log-odds) plus 2 % of that difference; the tiny models here stay far inside it (about 1e-3).
IG_TOLERANCE = 0.02


def lexical_classifier(folder, train, val, c_values=(0.1,), labels=("negative", "positive")):
    fitted = nbsvm_baseline(train, val, c_values=c_values, max_features=5000)
    joblib.dump(fitted.model, folder / "nbsvm.joblib")
    atomic_write_json(folder / "labels.json", {"labels": list(labels)})
    return LexicalClassifier.from_paths(folder / "nbsvm.joblib", folder)


def token_ids(rows=5, length=14, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, len(VOCABULARY), size=(rows, length)).astype(np.int32)
    ids[:, 0] = 2
    for row in range(rows):
        ids[row, rng.integers(3, length) :] = 0
    return ids


def tiny_model(pooling: str, ngram_max: int):
    keras.utils.set_random_seed(1)
    config = ModelConfig(
        pooling=pooling,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        intermediate_dim=32,
        dropout=0.0,
        classifier_dropout=0.0,
        ngram_max=ngram_max,
        ngram_buckets=97,
    )
    return build_model(config, len(VOCABULARY), 16)


def test_nbsvm_contributions_sum_exactly_to_its_logit(tmp_path):
    classifier = lexical_classifier(tmp_path, reviews(200, 6), reviews(60, 7))
    texts = [clean_text(t) for t in ["A superb, wonderful film!", "Dull, awful and boring.", "the plot"]]
    counts = classifier.prepare(texts)
    probabilities = classifier.score(counts).astype(np.float64)
    explanations = lexical_explanations(classifier, counts, texts)
    for explanation, p in zip(explanations, probabilities[:, 1]):
        logit = np.log(p / (1 - p))
        assert explanation.log_odds == pytest.approx(logit, abs=1e-4)  # float32 probabilities
        assert explanation.reference + sum(explanation.items.values()) == pytest.approx(explanation.log_odds, abs=1e-9)
        # the words in order share every n-gram's contribution: they add up to the same total
        assert sum(v for _, v in explanation.words) == pytest.approx(sum(explanation.items.values()), abs=1e-9)
    first = explanations[0]
    assert [w for w, _ in first.words] == ["a", "superb", "wonderful", "film", "!"]
    assert first.items["superb"] > 0 and explanations[1].items["awful"] < 0
    assert all(" " not in item or item in classifier.lexical.steps[0][1].vocabulary_ for item in first.items)


def test_more_classes_explain_the_predicted_class_one_vs_rest_logit(tmp_path):
    classifier = lexical_classifier(
        tmp_path, reviews(240, 6, classes=3), reviews(60, 7, classes=3), labels=("negative", "positive", "mixed")
    )
    counts = classifier.prepare([clean_text(t) for t in reviews(6, 9, classes=3)["text"]])
    predicted = classifier.score(counts).argmax(axis=1)
    model = classifier.lexical.steps[-1][1]
    for row, explanation in enumerate(lexical_explanations(classifier, counts)):
        regression = model.regressions_[int(predicted[row])]
        features = counts[row].multiply(model.ratios_[int(predicted[row])]).tocsr()
        assert explanation.log_odds == pytest.approx(float(regression.decision_function(features)[0]), abs=1e-6)


def test_a_model_without_per_ngram_weights_is_one_error(tmp_path):
    classifier = lexical_classifier(tmp_path, reviews(100, 6), reviews(30, 7))
    classifier.lexical = tfidf_baseline(reviews(100, 6), seed=0)
    with pytest.raises(InputError, match="explanations: the lexical model is not the pipeline's NBSVM"):
        lexical_explanations(classifier, classifier.prepare(["good film"]))


@pytest.mark.parametrize("pooling,ngram_max", [("first_token", 1), ("mean", 3)])
def test_integrated_gradients_sum_to_the_log_odds_difference_from_the_all_pad_review(pooling, ngram_max):
    model, ids = tiny_model(pooling, ngram_max), token_ids()
    attributions, at_text, at_reference = integrated_gradients(model, ids, VOCABULARY, steps=16)
    probabilities = np.asarray(model.predict(ids, verbose=0), dtype=np.float64)
    np.testing.assert_allclose(at_text, np.log(probabilities[:, 1] / probabilities[:, 0]), atol=1e-5)
    difference = at_text - at_reference
    assert np.all(np.abs(attributions.sum(axis=1) - difference) <= IG_TOLERANCE * np.abs(difference) + 1e-3)
    assert np.abs(difference).max() > 1e-3  # the check is not of zeros
    assert np.all(attributions[:, 0] == 0) and np.all(attributions[ids == 0] == 0)  # [CLS] and padding: nothing
    # padding after the text changes nothing
    wider = np.pad(ids, ((0, 0), (0, 2)))
    wider_attributions, wider_text, _ = integrated_gradients(model, wider, VOCABULARY, steps=16)
    np.testing.assert_allclose(wider_attributions[:, : ids.shape[1]], attributions, atol=1e-4)
    np.testing.assert_allclose(wider_text, at_text, atol=1e-5)


def test_a_pass_holds_fewer_sequences_where_their_activations_would_pass_the_memory_budget(monkeypatch):
    """A pretrained encoder's 256 interpolated sequences of 128 tokens kept 19.6 GB; the budget bounds a pass by its
    encoder blocks' width and the text's length, and the attributions do not depend on how rows are grouped."""
    from pipeline.model import explain
    from pipeline.model.transformer import encoder_blocks

    model, ids = tiny_model("mean", 3), token_ids(rows=6, seed=4)
    blocks = encoder_blocks(model)
    assert len(blocks) == 2 and blocks[0].intermediate_dim == 32  # tiny_model's
    width = ids.shape[1]
    per_token = sum(12 * block.intermediate_dim + 6 * block.num_heads * width for block in blocks)
    assert explain.sequences_per_pass(model, width) == explain.IG_BATCH  # a tiny encoder: the cap
    everything = integrated_gradients(model, ids, VOCABULARY, steps=4)
    monkeypatch.setattr(explain, "IG_MEMORY_FLOATS", per_token * width * 9)
    assert explain.sequences_per_pass(model, width) == 9  # two texts of 4 steps a pass
    assert explain.sequences_per_pass(model, 2 * width) < 9 and explain.sequences_per_pass(model, 10 * width) == 1
    grouped = integrated_gradients(model, ids, VOCABULARY, steps=4)
    for whole, parts in zip(everything, grouped):
        np.testing.assert_allclose(parts, whole, atol=1e-5)


def test_the_control_two_steps_miss_what_sixteen_find():
    """With a path sum of 2 points the completeness gap is larger than with 16: the tolerance tests the method."""
    model, ids = tiny_model("mean", 3), token_ids(rows=8, seed=3)
    gaps = {}
    for steps in (2, 16):
        attributions, at_text, at_reference = integrated_gradients(model, ids, VOCABULARY, steps=steps)
        gaps[steps] = np.abs(attributions.sum(axis=1) - (at_text - at_reference)).max()
    assert gaps[16] < gaps[2]


def test_word_pieces_join_their_word_and_special_tokens_are_left_out():
    ids = np.array([2, 7, 8, 9, 5, 0, 0])
    words = word_attributions(ids, np.array([0.0, 0.5, 0.25, -1.0, 2.0, 0.0, 0.0]), VOCABULARY)
    assert words == (("films", 0.75), ("not", -1.0), ("good", 2.0))


def test_the_fusion_weighs_each_part_as_it_weighs_their_log_probabilities():
    transformer = Explanation({"good": 1.0, "film": 0.2}, log_odds=1.5, reference=0.3)
    lexical = Explanation({"good": 0.5, "not good": -2.0}, log_odds=-1.0, reference=0.5)
    fused = fused_explanation(transformer, lexical, 0.25)
    assert fused.items == pytest.approx({"good": 0.625, "film": 0.05, "not good": -1.5})
    assert fused.log_odds == pytest.approx(0.25 * 1.5 + 0.75 * -1.0)
    # the fused log-odds is the log-odds of fuse_probabilities' output
    p_t, p_l = 1 / (1 + np.exp(-1.5)), 1 / (1 + np.exp(1.0))
    fused_p = fuse_probabilities(np.array([[1 - p_t, p_t]]), np.array([[1 - p_l, p_l]]), 0.25)
    assert log_odds(np.log(fused_p.astype(np.float64)), np.array([1]))[0] == pytest.approx(fused.log_odds, abs=1e-5)


def test_the_column_lists_the_largest_contributions_signed_and_ordered():
    items = {"great": 1.2, "boring": -1.5, "film": 0.01, "loved": 0.9, "the": 0.0, "not good": -0.4}
    assert explanation_text(items, top=4) == "-boring, +great, +loved, -not good"
    assert explanation_text(items, top=10) == "-boring, +great, +loved, -not good, +film"  # zero left out
    assert explanation_text({}) == ""
    # punctuation is left out of the column, except ! and ?
    assert explanation_text({".": -3.0, ",": 2.0, "!": 1.5, "good": 1.0, "?": -0.5, "_": 4.0}) == "+!, +good, -?"


def test_log_odds_of_more_classes_is_the_target_against_the_mean_of_the_others():
    logs = np.log(np.array([[0.2, 0.5, 0.3]]))
    assert log_odds(logs, np.array([1]))[0] == pytest.approx(np.log(0.5) - (np.log(0.2) + np.log(0.3)) / 2)


def test_the_explained_vectors_are_the_models_own_layers():
    """While explaining, the embedding layers answer with the given vectors; afterwards they compute again."""
    model, ids = tiny_model("mean", 3), token_ids(rows=2)
    before = np.asarray(model.predict(ids, verbose=0))
    integrated_gradients(model, ids, VOCABULARY, steps=2)
    np.testing.assert_array_equal(np.asarray(model.predict(ids, verbose=0)), before)
    assert "call" not in vars(model.get_layer("token_embedding"))


def test_no_token_embedding_is_one_error():
    inputs = keras.Input(shape=(None,), dtype="int32")
    model = keras.Model(
        inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.Embedding(10, 4, name="other")(inputs)[:, 0])
    )
    with pytest.raises(InputError, match="no layer named token_embedding"):
        integrated_gradients(model, token_ids(rows=1)[:, :3] % 10, VOCABULARY[:10])


def test_a_saved_and_loaded_model_explains_the_same(tmp_path):
    model, ids = tiny_model("first_token", 3), token_ids(rows=3)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    here = integrated_gradients(model, ids, VOCABULARY, steps=4)
    there = integrated_gradients(loaded, ids, VOCABULARY, steps=4)
    for a, b in zip(here, there):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_rows_explained_together_get_what_each_gets_alone():
    """Rows are grouped by length and cut to the group's longest: a short text next to long ones is unchanged."""
    model, ids = tiny_model("mean", 3), token_ids(rows=6, seed=5)
    together = integrated_gradients(model, ids, VOCABULARY, steps=4)
    for row in range(len(ids)):
        alone = integrated_gradients(model, ids[row : row + 1], VOCABULARY, steps=4)
        for a, b in zip(together, alone):
            np.testing.assert_allclose(a[row], b[0], atol=1e-5)


def test_a_preset_backbones_token_embedding_is_explained_the_same_way(tmp_path):
    """A classifier on a KerasHub backbone (the tests' tiny preset): its nested token embedding is found, the
    attributions add up, and [CLS] and [SEP] (kept in the reference) get nothing."""
    from pipeline.model.preset_classifier import build_preset_model, load_preset_backbone
    from tests.tiny_preset import write_tiny_preset

    write_tiny_preset(tmp_path / "preset", with_tokenizer=False)
    model = build_preset_model(
        ModelConfig(preset=str(tmp_path / "preset"), ngram_max=1), load_preset_backbone(str(tmp_path / "preset"))
    )
    ids = np.array([[2, 7, 9, 11, 3, 0, 0], [2, 8, 12, 3, 0, 0, 0]], dtype=np.int32)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + [f"w{i}" for i in range(36)]
    attributions, at_text, at_reference = integrated_gradients(model, ids, vocabulary)
    difference = at_text - at_reference
    assert np.all(np.abs(attributions.sum(axis=1) - difference) <= IG_TOLERANCE * np.abs(difference) + 1e-3)
    assert np.all(attributions[ids == 2] == 0) and np.all(attributions[ids == 3] == 0)
