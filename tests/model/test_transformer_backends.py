"""One model, any Keras backend: the n-gram hash is the exact integer hash for every bucket count (int32 arithmetic
that cannot wrap), and a model trained under TensorFlow (the suite's backend) scores under JAX, and one trained
under JAX under TensorFlow, with the same probabilities; a JAX training step of the own encoder and of a preset.

The other backend runs in a subprocess (``tests/model/backend_worker.py``): Keras reads ``KERAS_BACKEND`` once."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from pipeline.core.predictions import fuse_probabilities
from pipeline.model.transformer import NGRAM_HASH_MULTIPLIERS, build_model, hashed_ngram_ids
from tests.conftest import PROJECT_ROOT
from tests.model.backend_worker import one_step, tiny_config

BUCKET_COUNTS = [2, 97, 4096, 100_000, 262_144, 1_000_003, 2**28]


def exact_hashes(ids: np.ndarray, ngram_max: int, buckets: int) -> np.ndarray:
    """The hash in Python's unbounded integers: what every backend must give."""
    ids = ids.astype(object)
    padded = np.concatenate([np.zeros((len(ids), ngram_max - 1), dtype=object), ids], axis=1)
    hashes, found = ids, []
    for back in range(1, ngram_max):
        shifted = padded[:, ngram_max - 1 - back : ngram_max - 1 - back + ids.shape[1]]
        multiplier = NGRAM_HASH_MULTIPLIERS[(back - 1) % len(NGRAM_HASH_MULTIPLIERS)]
        hashes = (hashes * (multiplier % buckets) + shifted + back + 1) % buckets
        found.append(hashes)
    return np.stack(found, axis=1).astype(np.int64)


def wrapped_int32_hashes(ids: np.ndarray, ngram_max: int, buckets: int) -> np.ndarray:
    """The hash before it was made int32-safe, as JAX ran it: one product per step, wrapping at 2^31."""
    ids = ids.astype(np.int32)
    padded = np.pad(ids, [[0, 0], [ngram_max - 1, 0]])
    hashes, found = ids, []
    with np.errstate(over="ignore"):
        for back in range(1, ngram_max):
            shifted = padded[:, ngram_max - 1 - back : ngram_max - 1 - back + ids.shape[1]]
            multiplier = np.int32(NGRAM_HASH_MULTIPLIERS[(back - 1) % len(NGRAM_HASH_MULTIPLIERS)] % buckets)
            hashes = np.mod(hashes * multiplier + shifted + np.int32(back + 1), np.int32(buckets))
            found.append(hashes)
    return np.stack(found, axis=1)


def token_ids(rows: int = 6, length: int = 24, vocabulary: int = 60, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocabulary, size=(rows, length)).astype(np.int32)
    ids[:, 0] = 2
    for row in range(rows):
        ids[row, rng.integers(4, length) :] = 0  # padded ends of other lengths
    return ids


def run_worker(commands: list[str], folder, backend: str = "jax") -> None:
    environment = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "PYTHONPATH": str(PROJECT_ROOT),
        "CUDA_VISIBLE_DEVICES": "",
        "JAX_PLATFORMS": "cpu",
    }
    completed = subprocess.run(
        [sys.executable, "-m", "tests.model.backend_worker", ",".join(commands), str(folder)],
        cwd=PROJECT_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.fixture(scope="module")
def on_jax(tmp_path_factory):
    """One JAX process over what this TensorFlow process prepared: the hash of wide token ids, the probabilities
    of a model trained here, a training step of the own encoder (saved) and of a preset classifier. Yields
    ``(folder, the TensorFlow model, its ids)``; each command's outputs are in ``folder/<command>/``."""
    from tests.tiny_preset import write_tiny_preset

    folder = tmp_path_factory.mktemp("on_jax")
    for command in ("hash", "predict", "train", "lazy-step", "train-preset", "explain"):
        (folder / command).mkdir()
    hash_ids = np.random.default_rng(2).integers(0, 2**31 - 1, size=(4, 30)).astype(np.int32)
    np.save(folder / "hash" / "ids.npy", hash_ids)
    np.save(folder / "hash" / "buckets.npy", np.array(BUCKET_COUNTS))
    ids, labels = token_ids(), np.array([0, 1, 1, 0, 1, 0], dtype=np.int32)
    keras.utils.set_random_seed(0)
    model = build_model(tiny_config(), 60, ids.shape[1])
    step = one_step(model, ids, labels)
    assert step["backend"] == "tensorflow" and step["weight_change"] > 0
    model.save(folder / "predict" / "model.keras")
    np.save(folder / "predict" / "ids.npy", ids)
    np.save(folder / "train" / "ids.npy", token_ids(seed=4))
    np.save(folder / "train" / "labels.npy", np.array([1, 1, 0, 0, 1, 0], dtype=np.int32))
    without_dropout = build_model(
        dataclasses.replace(tiny_config(), dropout=0.0, classifier_dropout=0.0, ngram_dropout=0.0), 60, ids.shape[1]
    )
    without_dropout.save(folder / "lazy-step" / "model.keras")
    np.save(folder / "lazy-step" / "ids.npy", ids[:, :16])  # rows of the tables and positions left unread
    np.save(folder / "lazy-step" / "labels.npy", labels)
    write_tiny_preset(folder / "train-preset" / "preset", with_tokenizer=False)
    np.save(folder / "train-preset" / "ids.npy", token_ids(vocabulary=40, seed=5))
    np.save(folder / "train-preset" / "labels.npy", np.array([0, 1, 0, 1, 1, 0], dtype=np.int32))
    model.save(folder / "explain" / "model.keras")
    np.save(folder / "explain" / "ids.npy", ids)
    (folder / "explain" / "vocabulary.json").write_text(json.dumps([f"t{i}" for i in range(60)]))
    run_worker(["hash", "predict", "train", "lazy-step", "train-preset", "explain"], folder)
    return folder, model, ids


@pytest.mark.parametrize("buckets", BUCKET_COUNTS)
def test_the_ngram_hash_is_the_exact_integer_hash_for_any_bucket_count(buckets):
    ids = np.random.default_rng(1).integers(0, 2**31 - 1, size=(3, 40)).astype(np.int32)  # any int32 token id
    ids[:, -4:] = 0
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(hashed_ngram_ids(ids, 4, buckets)), exact_hashes(ids, 4, buckets)
    )


def test_a_one_product_int32_hash_wraps_unless_the_bucket_count_is_a_power_of_two():
    """The control: the hash as it ran under JAX before (int64 read as int32) differs from the exact one for a
    bucket count that is not a power of two, and agrees for one that is, which is why it went unseen."""
    ids = token_ids(vocabulary=20_000)
    assert not np.array_equal(wrapped_int32_hashes(ids, 3, 100_000), exact_hashes(ids, 3, 100_000))
    np.testing.assert_array_equal(wrapped_int32_hashes(ids, 3, 2**18), exact_hashes(ids, 3, 2**18))


def test_the_hash_is_the_same_under_jax(on_jax):
    folder = on_jax[0] / "hash"
    ids = np.load(folder / "ids.npy")
    for buckets in BUCKET_COUNTS:
        np.testing.assert_array_equal(np.load(folder / f"hashes_{buckets}.npy"), exact_hashes(ids, 3, buckets))


def test_a_model_trained_under_tensorflow_scores_the_same_under_jax_fused_too(on_jax):
    folder, model, ids = on_jax
    here, there = np.asarray(model.predict(ids, verbose=0)), np.load(folder / "predict" / "probabilities.npy")
    np.testing.assert_allclose(there, here, atol=1e-5)
    lexical = np.random.default_rng(3).dirichlet([1, 1], size=len(ids)).astype(np.float32)
    np.testing.assert_allclose(
        fuse_probabilities(there, lexical, 0.4), fuse_probabilities(here, lexical, 0.4), atol=1e-5
    )


def test_integrated_gradients_under_jax_are_those_under_tensorflow(on_jax):
    """Gradients from jax.grad and from TensorFlow's tape: the same attributions, summing to the same difference."""
    from pipeline.model.explain import integrated_gradients

    folder, model, ids = on_jax
    here = integrated_gradients(model, ids, [f"t{i}" for i in range(60)], steps=8)
    for name, values in zip(("attributions", "log_odds", "reference"), here):
        np.testing.assert_allclose(np.load(folder / "explain" / f"{name}.npy"), values, atol=1e-4)
    assert np.abs(here[0]).max() > 1e-3


def test_a_jax_training_step_of_the_own_encoder_scores_the_same_under_tensorflow(on_jax):
    folder = on_jax[0] / "train"
    step = json.loads((folder / "step.json").read_text())
    assert step["backend"] == "jax" and np.isfinite(step["loss"]) and step["weight_change"] > 0
    loaded = keras.saving.load_model(folder / "model.keras")
    np.testing.assert_allclose(
        np.asarray(loaded.predict(np.load(folder / "ids.npy"), verbose=0)),
        np.load(folder / "probabilities.npy"),
        atol=1e-5,
    )


def test_a_lazy_adamw_step_on_jax_moves_the_weights_as_on_tensorflow(on_jax):
    """TensorFlow updates the rows of the look-up tables a batch read (sparse gradients); JAX's masked dense rule the
    rows whose gradient is not zero. They agree but on rows read with a zero gradient (the [PAD] row, the buckets of
    padding n-grams): TensorFlow decays those, JAX leaves them, and no prediction reads them."""
    from pipeline.model.optimizers import lookup_tables
    from tests.model.backend_worker import lazy_step

    folder = on_jax[0] / "lazy-step"
    ids = np.load(folder / "ids.npy")
    model = keras.saving.load_model(folder / "model.keras")
    tables = lookup_tables(model)
    before = {variable.path: np.array(variable.numpy()) for variable in model.trainable_variables}
    here = lazy_step(model, ids, np.load(folder / "labels.npy"))
    there = dict(np.load(folder / "weights.npz"))
    assert set(there) == set(here) and tables == {"token_embedding/embeddings", "ngram_embedding/table/embeddings"}
    for path, weights in here.items():
        if path not in tables:  # Adam turns a gradient that is zero but for rounding (a key bias) into steps of ~1e-5
            np.testing.assert_allclose(there[path], weights, atol=5e-5, err_msg=path)
            continue
        kept_on_jax = (there[path] == before[path]).all(axis=1)
        np.testing.assert_allclose(there[path][~kept_on_jax], weights[~kept_on_jax], atol=2e-6, err_msg=path)
        differing = ~np.isclose(there[path], weights, atol=2e-6).all(axis=1)
        assert set(np.flatnonzero(differing)) <= set(np.flatnonzero(kept_on_jax)), path
    tokens, unread = "token_embedding/embeddings", np.setdiff1d(np.arange(60), ids)
    assert np.array_equal(here[tokens][unread], before[tokens][unread])  # both leave unread rows
    assert np.array_equal(there[tokens][unread], before[tokens][unread])
    assert np.array_equal(there[tokens][0], before[tokens][0]) and not np.allclose(here[tokens][0], before[tokens][0])
    np.testing.assert_allclose(
        np.load(folder / "probabilities.npy"), np.asarray(model.predict(ids, verbose=0)), atol=1e-5
    )


def test_a_jax_training_step_of_a_preset_classifier(on_jax):
    step = json.loads((on_jax[0] / "train-preset" / "step.json").read_text())
    assert step["backend"] == "jax" and np.isfinite(step["loss"]) and step["weight_change"] > 0
