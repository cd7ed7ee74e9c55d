"""LazyAdamW (``training.sparse_updates``): Keras' AdamW wherever a batch touches every row, embedding rows it did not
read left exactly as they were."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipeline.model.optimizers import LazyAdamW, summed_rows

ROWS, WIDTH = 12, 4


def tiny_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(None,), dtype="int32")
    vectors = keras.layers.Embedding(ROWS, WIDTH, name="table")(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(vectors)
    return keras.Model(ids, keras.layers.Dense(2, activation="softmax", name="head")(pooled))


def train(optimizer, batches, seed: int = 0, dense_gradients: bool = False) -> keras.Model:
    model = tiny_model(seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    for ids, labels in batches:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        if dense_gradients:
            grads = [tf.convert_to_tensor(g) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return model


def optimizers():
    settings = dict(learning_rate=0.05, weight_decay=0.1, clipnorm=0.01)  # a clipnorm that bites
    return keras.optimizers.AdamW(**settings), LazyAdamW(**settings)


def test_the_table_gradient_reaches_the_optimizer_sparse():
    """What LazyAdamW relies on: a look-up's gradient is IndexedSlices (else it would fall back to dense AdamW)."""
    model = tiny_model()
    with tf.GradientTape() as tape:
        loss = keras.ops.sum(model(np.array([[1, 2]]), training=True))
    table_gradient, *_ = tape.gradient(loss, model.trainable_variables)
    assert isinstance(table_gradient, tf.IndexedSlices)


def test_equal_to_adamw_when_every_row_is_read():
    """Every batch reads every row (some twice: repeated indices are summed): the same weights as AdamW given the
    dense gradient, the dense head included, with weight decay and clipping on. (Keras' AdamW given the sparse
    gradient itself squares each occurrence of a repeated row apart, sum of squares for square of the sum.)"""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(6):
        ids = np.concatenate([rng.permutation(ROWS), rng.integers(0, ROWS, 4)]).reshape(4, 4)
        batches.append((ids.astype("int32"), rng.integers(0, 2, 4)))
    dense_opt, lazy_opt = optimizers()
    dense, lazy = train(dense_opt, batches, dense_gradients=True), train(lazy_opt, batches)
    start = tiny_model()
    assert not np.allclose(dense.get_layer("table").get_weights()[0], start.get_layer("table").get_weights()[0])
    for a, b in zip(dense.get_weights(), lazy.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_rows_not_read_keep_their_weights_and_moments():
    """After a step that read every row, steps reading rows 0-5 only: AdamW still moves rows 6-11 (momentum and
    weight decay), LazyAdamW leaves them and their moments exactly as they were."""
    everything = (np.arange(ROWS, dtype="int32").reshape(3, 4), np.array([0, 1, 0]))
    some = [(np.array([[0, 1, 2], [3, 4, 5]], dtype="int32"), np.array([1, 0]))] * 3
    dense_opt, lazy_opt = optimizers()
    after_first = train(LazyAdamW(learning_rate=0.05, weight_decay=0.1, clipnorm=0.01), [everything])
    dense, lazy = train(dense_opt, [everything, *some]), train(lazy_opt, [everything, *some])
    first = after_first.get_layer("table").get_weights()[0]
    assert not np.allclose(dense.get_layer("table").get_weights()[0][6:], first[6:])  # the control
    np.testing.assert_array_equal(lazy.get_layer("table").get_weights()[0][6:], first[6:])
    assert not np.allclose(lazy.get_layer("table").get_weights()[0][:6], first[:6])
    momentum = lazy_opt._momentums[0].numpy()
    assert np.count_nonzero(momentum[6:]) and np.count_nonzero(momentum[:6])


def test_summed_rows_adds_repeated_indices():
    gradient = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([3, 1, 3]), tf.constant([5, 1]))
    rows = summed_rows(gradient)
    assert dict(zip(rows.indices.numpy().tolist(), rows.values.numpy()[:, 0].tolist())) == {3: 5.0, 1: 2.0}
    np.testing.assert_array_equal(tf.convert_to_tensor(rows), tf.convert_to_tensor(gradient))


def test_a_compiled_model_with_sparse_updates_trains_and_saves(tmp_path):
    """``training.sparse_updates`` reaches compile_model; the saved model (no optimizer) loads without the class."""
    from pipeline.config import Config
    from pipeline.model.fit import compile_model

    config = Config().with_settings([("training.sparse_updates", True)])
    model = compile_model(tiny_model(), config.training, False, steps_per_epoch=2)
    assert isinstance(model.optimizer, LazyAdamW)
    before = model.get_layer("table").get_weights()[0].copy()
    model.fit(np.array([[1, 2], [3, 3]], dtype="int32"), np.array([0, 1]), epochs=1, verbose=0)
    after = model.get_layer("table").get_weights()[0]
    assert not np.allclose(after[[1, 2, 3]], before[[1, 2, 3]])
    np.testing.assert_array_equal(after[[0, 4, 5]], before[[0, 4, 5]])
    dense = config.with_settings([("training.sparse_updates", False)])
    assert isinstance(compile_model(tiny_model(), dense.training, False, 2).optimizer, keras.optimizers.AdamW)
    assert not isinstance(compile_model(tiny_model(), dense.training, False, 2).optimizer, LazyAdamW)


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_bad_sparse_updates_value_names_the_key(value):
    from pipeline.config import load_config
    from pipeline.core.errors import ConfigError

    with pytest.raises(ConfigError, match="training.sparse_updates"):
        load_config(None, [f"training.sparse_updates={value}"])
