import keras
import numpy as np
import pytest

from pipeline.config import ModelConfig
from pipeline.model.transformer import (
    FirstTokenPooling,
    HashedNgramEmbedding,
    MaskedMeanPooling,
    PaddingMask,
    build_model,
    hashed_ngram_ids,
    last_block_attention,
)
from pipeline.text.conventions import CLS_ID, PAD_ID

VOCABULARY_SIZE, MAX_LENGTH = 50, 32


def tiny_model(pooling: str, position: str = "learned", ngram_max: int = 1) -> keras.Model:
    keras.utils.set_random_seed(0)
    config = ModelConfig(
        pooling=pooling,
        position=position,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        intermediate_dim=32,
        dropout=0.1,
        classifier_dropout=0.1,
        ngram_max=ngram_max,
        ngram_buckets=97,
        ngram_dropout=0.2,
    )
    return build_model(config, VOCABULARY_SIZE, MAX_LENGTH)


def review(length: int, total: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    row = np.full((1, total), PAD_ID, dtype=np.int32)
    row[0, 0] = CLS_ID
    row[0, 1:length] = rng.integers(4, VOCABULARY_SIZE, length - 1)
    return row


@pytest.mark.parametrize("pooling", ["first_token", "mean"])
@pytest.mark.parametrize("position,ngram_max", [("learned", 1), ("sinusoidal", 1), ("none", 1), ("learned", 3)])
def test_padding_does_not_change_the_prediction(pooling, position, ngram_max):
    model = tiny_model(pooling, position, ngram_max)
    short = review(10, 12)
    predictions = [
        float(model(np.pad(short, ((0, 0), (0, total - 12))), training=False)[0, 0]) for total in (12, 20, MAX_LENGTH)
    ]
    np.testing.assert_allclose(predictions, predictions[0], atol=1e-5)


def test_first_token_output_reaches_distant_tokens():
    model = tiny_model("first_token")
    ids = review(MAX_LENGTH, MAX_LENGTH)
    changed = ids.copy()
    changed[0, MAX_LENGTH - 2] = (ids[0, MAX_LENGTH - 2] + 1 - 4) % (VOCABULARY_SIZE - 4) + 4
    before, after = float(model(ids)[0, 0]), float(model(changed)[0, 0])
    assert abs(before - after) > 1e-6


def test_masked_mean_ignores_padding():
    sequence = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]]], dtype=np.float32)
    mask = np.array([[True, True, False]])
    np.testing.assert_allclose(MaskedMeanPooling()(sequence, padding_mask=mask), [[2.0, 3.0]])
    np.testing.assert_allclose(FirstTokenPooling()(sequence, padding_mask=mask), [[1.0, 2.0]])
    all_padding = np.zeros((1, 3), dtype=bool)
    assert np.isfinite(MaskedMeanPooling()(sequence, padding_mask=all_padding)).all()


def test_padding_mask_layer():
    assert PaddingMask()(np.array([[2, 5, 0, 0]])).numpy().tolist() == [[True, True, False, False]]


@pytest.mark.parametrize(
    "layer",
    [PaddingMask(pad_id=3), FirstTokenPooling(), MaskedMeanPooling(), HashedNgramEmbedding(3, 101, 8, dropout=0.25)],
)
def test_custom_layers_config_round_trip(layer):
    clone = layer.__class__.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize("pooling,ngram_max", [("first_token", 1), ("mean", 1), ("first_token", 3)])
def test_keras_file_round_trip(pooling, ngram_max, tmp_path):
    model = tiny_model(pooling, ngram_max=ngram_max)
    ids = np.concatenate([review(8, MAX_LENGTH, 1), review(MAX_LENGTH, MAX_LENGTH, 2)])
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(model.predict(ids, verbose=0), loaded.predict(ids, verbose=0))


def test_attention_scores_come_from_the_last_block_and_skip_padding():
    model = tiny_model("first_token")
    scores = last_block_attention(model, review(6, 12))
    assert scores.shape == (1, 2, 12, 12)
    np.testing.assert_allclose(scores.sum(axis=-1), 1.0, atol=1e-5)
    assert np.abs(scores[0, :, :6, 6:]).max() < 1e-6  # real tokens never attend to padding


def test_output_is_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = tiny_model("mean")
        assert model(review(5, 8)).dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_masked_lm_shares_the_backbone_and_its_weights_transfer_by_name():
    from pipeline.model.transformer import (
        backbone_layer_names,
        backbone_weights,
        build_masked_lm,
        load_backbone_weights,
    )

    keras.utils.set_random_seed(0)
    config = ModelConfig(hidden_dim=16, num_layers=2, num_heads=2, intermediate_dim=32, dropout=0.0, ngram_max=1)
    masked_lm = build_masked_lm(config, VOCABULARY_SIZE, MAX_LENGTH)
    logits = masked_lm({"token_ids": review(10, 12), "mask_positions": np.array([[1, 3, 5]], dtype=np.int32)})
    assert tuple(logits.shape) == (1, 3, VOCABULARY_SIZE) and logits.dtype == "float32"
    # the output projection is the token embedding itself (tied), not a second matrix
    head = masked_lm.get_layer("mlm_head")
    assert head.token_embedding is masked_lm.get_layer("token_embedding")

    classifier = build_model(config, VOCABULARY_SIZE, MAX_LENGTH)
    assert backbone_layer_names(classifier) == backbone_layer_names(masked_lm)
    assert backbone_layer_names(classifier) == [
        "token_embedding",
        "position_embedding",
        "embedding_norm",
        "encoder_0",
        "encoder_1",
    ]
    loaded = load_backbone_weights(classifier, backbone_weights(masked_lm), "test")
    for name in loaded:
        for a, b in zip(classifier.get_layer(name).get_weights(), masked_lm.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)


def test_pretrained_weights_of_another_vocabulary_or_width_are_refused():
    from pipeline.core.errors import InputError
    from pipeline.model.transformer import backbone_weights, build_masked_lm, load_backbone_weights

    config = ModelConfig(hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=32, ngram_max=1)
    weights = backbone_weights(build_masked_lm(config, VOCABULARY_SIZE, MAX_LENGTH))
    with pytest.raises(InputError, match=r"token_embedding.*\(50, 16\).*\(60, 16\).*vocabulary"):
        load_backbone_weights(build_model(config, 60, MAX_LENGTH), weights, "pretrained.npz")
    wider = ModelConfig(hidden_dim=32, num_layers=1, num_heads=2, intermediate_dim=32, ngram_max=1)
    with pytest.raises(InputError, match="width"):
        load_backbone_weights(build_model(wider, VOCABULARY_SIZE, MAX_LENGTH), weights, "pretrained.npz")
    deeper = ModelConfig(hidden_dim=16, num_layers=2, num_heads=2, intermediate_dim=32, ngram_max=1)
    with pytest.raises(InputError, match="encoder_1"):
        load_backbone_weights(build_model(deeper, VOCABULARY_SIZE, MAX_LENGTH), weights, "pretrained.npz")


# --------------------------------------------------------------------------- hashed n-gram embeddings


def test_ngram_ids_hash_the_ngram_ending_at_each_position():
    ids = np.array([[2, 7, 9, 7, 9, 0, 0]], dtype=np.int32)
    buckets = hashed_ngram_ids(ids, 3, 1_000_003).numpy()
    assert buckets.shape == (1, 2, 7) and buckets.min() >= 0 and buckets.max() < 1_000_003
    bigrams, trigrams = buckets[0]
    assert bigrams[2] == bigrams[4] and bigrams[1] != bigrams[2]  # (7, 9) twice; (2, 7) is another bigram
    assert bigrams[3] != bigrams[2]  # (9, 7) is not (7, 9): order counts
    assert trigrams[2] != trigrams[4]  # (2, 7, 9) is not (9, 7, 9)
    assert len({*bigrams[1:5]} & {*trigrams[1:5]}) == 0  # n is part of the hash
    # the same n-gram anywhere in any row gets the same bucket; ids before the start count as [PAD]
    shifted = hashed_ngram_ids(np.array([[5, 5, 7, 9]], dtype=np.int32), 3, 1_000_003).numpy()
    assert shifted[0, 0, 3] == bigrams[2]
    assert (
        hashed_ngram_ids(np.array([[7]]), 2, 1_000_003).numpy()[0, 0, 0]
        == hashed_ngram_ids(np.array([[0, 7]]), 2, 1_000_003).numpy()[0, 0, 1]
    )


def test_ngram_ids_stay_in_range_for_large_ids_and_small_tables():
    ids = np.array([[2, 2**20, 2**20 - 1, 19_999, 3]], dtype=np.int32)
    for buckets in (2, 7, 2**18, 2**24):
        values = hashed_ngram_ids(ids, 4, buckets).numpy()
        assert values.min() >= 0 and values.max() < buckets


def test_ngram_embedding_is_zero_on_padding_and_drops_whole_vectors_in_training():
    keras.utils.set_random_seed(0)
    layer = HashedNgramEmbedding(3, 64, 8, dropout=0.5)
    ids = np.array([[2, 7, 9, 11, 0, 0]] * 64, dtype=np.int32)
    out = layer(ids, training=False).numpy()
    assert np.all(out[:, 4:] == 0) and np.all(np.abs(out[:, :4]).sum(-1) > 0)
    np.testing.assert_allclose(out[0], out[1])  # deterministic at inference
    trained = layer(ids, training=True).numpy()[:, 1:4]
    table = layer.table.embeddings.numpy()
    buckets = hashed_ngram_ids(ids[:1], 3, 64).numpy()[0]
    # every position is a sum of its kept n-gram vectors scaled by 1 / (1 - rate): 4 possible values
    for position in range(1, 4):
        bigram, trigram = table[buckets[0, position]] * 2, table[buckets[1, position]] * 2
        options = [np.zeros(8), bigram, trigram, bigram + trigram]
        distances = np.array([[np.abs(row - option).max() for option in options] for row in trained[:, position - 1]])
        assert distances.min(axis=1).max() < 1e-5
        seen = distances.argmin(axis=1)
        assert len(set(seen)) == 4  # 64 rows at rate 0.5: every keep/drop pattern occurs


def test_ngrams_change_what_the_model_sees_of_word_order():
    """Without n-grams and positions a bag of tokens: swapping two tokens changes nothing; with n-grams it does."""
    ids = review(12, 12)
    swapped = ids.copy()
    swapped[0, [3, 7]] = swapped[0, [7, 3]]
    plain, with_ngrams = tiny_model("mean", "none", 1), tiny_model("mean", "none", 3)
    assert abs(float(plain(ids)[0, 0]) - float(plain(swapped)[0, 0])) < 1e-5
    assert abs(float(with_ngrams(ids)[0, 0]) - float(with_ngrams(swapped)[0, 0])) > 1e-6


def test_ngram_table_is_a_backbone_layer_and_an_ngram_free_backbone_is_refused():
    from pipeline.core.errors import InputError
    from pipeline.model.transformer import (
        backbone_layer_names,
        backbone_weights,
        build_masked_lm,
        load_backbone_weights,
    )

    plain = ModelConfig(hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=32, ngram_max=1)
    with_ngrams = ModelConfig(
        hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=32, ngram_max=2, ngram_buckets=31
    )
    assert "ngram_embedding" in backbone_layer_names(build_masked_lm(with_ngrams, VOCABULARY_SIZE, MAX_LENGTH))
    weights = backbone_weights(build_masked_lm(plain, VOCABULARY_SIZE, MAX_LENGTH))
    with pytest.raises(InputError, match="ngram_embedding"):
        load_backbone_weights(build_model(with_ngrams, VOCABULARY_SIZE, MAX_LENGTH), weights, "pretrained.npz")
