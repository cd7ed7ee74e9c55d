"""Training-step measurements for ``make bench``: the same-run GEMM peak, classifier and masked-LM steps,
TensorFlow thread settings and dense against lazy (sparse) n-gram table updates.

Reads and writes no file: each function builds fresh models on the token ids it is given and returns rates.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from pipeline.config import ModelConfig
from pipeline.model.flops import EncoderShape, batch_flops, classifier_forward_flops, masked_lm_forward_flops
from pipeline.runtime.batching import TRAINING_LENGTH_MULTIPLE, batch_width, bucketed_batches, padding_fraction
from pipeline.stages.pretrain.masking import mask_generator
from pipeline.text.conventions import PAD_ID

MEASURED_BATCHES = 8
# The encoders measured besides the configured one: the one-block width-64 model that was the
# default before pretraining and n-grams, and the pretraining candidate (both on tokens alone).
REFERENCE_ENCODERS = {
    "width 64 x 1 block": ModelConfig(hidden_dim=64, num_layers=1, num_heads=2, intermediate_dim=128, ngram_max=1),
    "width 256 x 2 blocks": ModelConfig(hidden_dim=256, num_layers=2, num_heads=4, intermediate_dim=1024, ngram_max=1),
}
THREAD_SETTINGS = ((0, 0), (2, 1), (1, 2))  # (intra-op, inter-op); 0 lets TensorFlow choose


def measured_encoders(model: ModelConfig) -> dict[str, ModelConfig]:
    """The configured encoder plus each reference encoder of another shape (an identical one is measured once)."""
    shape = lambda m: (m.hidden_dim, m.num_layers, m.num_heads, m.intermediate_dim)  # noqa: E731
    return {
        "configured": model,
        **{name: reference for name, reference in REFERENCE_ENCODERS.items() if shape(reference) != shape(model)},
    }


def gemm_gflops(m: int, k: int, n: int, dtype: str, seconds: float = 1.0) -> float:
    """GFLOP/s of a compiled ``[m, k] @ [k, n]`` matmul, warm-up excluded, repeated for about ``seconds``."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal([m, k]), dtype)
    b = tf.cast(tf.random.normal([k, n]), dtype)
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()
    repeats, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        result = matmul(a, b)
        repeats += 1
    result.numpy()
    return 2 * m * k * n * repeats / (time.perf_counter() - started) / 1e9


def measure_peak(encoders: dict[str, ModelConfig], tokens: int) -> dict:
    """The same-run peak: a large square GEMM and each encoder's own GEMM shapes, float32 and bfloat16."""
    peak = {}
    for dtype in ("float32", "bfloat16"):
        entry = {"square_2048": gemm_gflops(2048, 2048, 2048, dtype)}
        for name, model in encoders.items():
            d, f = model.hidden_dim, model.intermediate_dim
            entry[f"{name}: tokens x {d} x {d}"] = gemm_gflops(tokens, d, d, dtype)
            entry[f"{name}: tokens x {d} x {f}"] = gemm_gflops(tokens, d, f, dtype)
        peak[dtype] = entry
    return peak


def sample_batches(ids: np.ndarray, batch_size: int, count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` length-bucketed batches of real token ids, each trimmed to its width."""
    lengths = (ids != PAD_ID).sum(axis=1)
    batches = bucketed_batches(lengths, batch_size, seed)[:count]
    return [ids[rows, : batch_width(lengths[rows].max(), TRAINING_LENGTH_MULTIPLE, ids.shape[1])] for rows in batches]


def padding_fractions(ids: np.ndarray, batch_size: int, max_length: int) -> dict[str, float]:
    """The fraction of computed positions that are padding in full-width batches and in length-bucketed ones."""
    lengths = (ids != PAD_ID).sum(axis=1)
    return {
        "full_width": padding_fraction(lengths, [np.arange(len(lengths))], max_length, max_length),
        "bucketed": padding_fraction(
            lengths, bucketed_batches(lengths, batch_size, 0), TRAINING_LENGTH_MULTIPLE, max_length
        ),
    }


def _timed_passes(step, batches) -> float:
    """Seconds of the second pass over ``batches``; the first traces every shape (warm-up)."""
    for batch in batches:
        step(batch)
    started = time.perf_counter()
    for batch in batches:
        step(batch)
    return time.perf_counter() - started


def _rates(batches: list[np.ndarray], seconds: float, flops: int) -> dict:
    """Tokens, rows and GFLOP/s of ``seconds`` spent on ``batches``, and milliseconds per step."""
    tokens = sum(int((b != PAD_ID).sum()) for b in batches)
    rows = sum(len(b) for b in batches)
    return {
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "rows_per_second": rows / seconds,
        "gflops": flops / seconds / 1e9,
        "ms_per_step": 1000 * seconds / len(batches),
    }


def measure_classifier_step(
    model_config: ModelConfig,
    vocabulary_size: int,
    max_length: int,
    batches: list[np.ndarray],
    policy: str = "float32",
    jit: bool = False,
) -> dict:
    """The classifier's training-step rates on ``batches`` under the precision ``policy`` (and XLA if ``jit``)."""
    import keras

    from pipeline.model.transformer import build_model

    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = build_model(model_config, vocabulary_size, max_length, 2)
        model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss="sparse_categorical_crossentropy", jit_compile=jit)
        seconds = _timed_passes(lambda batch: model.train_on_batch(batch, np.zeros(len(batch), np.int32)), batches)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    shape = EncoderShape.from_config(model_config, vocabulary_size)
    flops = sum(batch_flops(classifier_forward_flops(shape, b.shape[1], 2), len(b), training=True) for b in batches)
    return _rates(batches, seconds, flops)


def measure_masked_lm_step(
    model_config: ModelConfig,
    vocabulary_size: int,
    max_length: int,
    batches: list[np.ndarray],
    mask_rate: float,
    policy: str = "float32",
) -> dict:
    """The masked-LM training-step rates on ``batches`` masked at ``mask_rate``, under the precision ``policy``."""
    import keras

    from pipeline.model.transformer import build_masked_lm

    masked = [
        {
            name: np.asarray(value)
            for name, value in mask_generator(vocabulary_size, batch.shape[1], mask_rate)(batch).items()
        }
        for batch in batches
    ]
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = build_masked_lm(model_config, vocabulary_size, max_length)
        model.compile(
            optimizer=keras.optimizers.AdamW(1e-4), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )

        def step(inputs):
            model.train_on_batch(
                {"token_ids": inputs["token_ids"], "mask_positions": inputs["mask_positions"]},
                inputs["mask_ids"],
                sample_weight=inputs["mask_weights"],
            )

        seconds = _timed_passes(step, masked)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    shape = EncoderShape.from_config(model_config, vocabulary_size)
    flops = sum(
        batch_flops(
            masked_lm_forward_flops(shape, m["token_ids"].shape[1], m["mask_positions"].shape[1]),
            len(m["token_ids"]),
            training=True,
        )
        for m in masked
    )
    return _rates(batches, seconds, flops)


def _classifier_step_with_threads(intra: int, inter: int, model_config, vocabulary_size, max_length, batches) -> dict:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return measure_classifier_step(model_config, vocabulary_size, max_length, batches)


def measure_threads(model_config, vocabulary_size, max_length, batches) -> dict:
    """The classifier step under each (intra-op, inter-op) setting, each in a fresh process (TF fixes them at start)."""
    results = {}
    for intra, inter in THREAD_SETTINGS:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results[f"intra {intra}, inter {inter}"] = pool.submit(
                _classifier_step_with_threads, intra, inter, model_config, vocabulary_size, max_length, batches
            ).result()
    return results


def measure_training_steps(
    encoders: dict[str, ModelConfig], vocabulary_size: int, max_length: int, batches: list[np.ndarray], mask_rate: float
) -> dict:
    """Every encoder's classifier step (float32, ``mixed_bfloat16``, float32 with XLA) and masked-LM step (float32,
    ``mixed_bfloat16``), and the configured encoder's classifier step under each thread setting."""
    return {
        "classifier_step": {
            name: {
                "float32": measure_classifier_step(m, vocabulary_size, max_length, batches),
                "mixed_bfloat16": measure_classifier_step(m, vocabulary_size, max_length, batches, "mixed_bfloat16"),
                "float32 + XLA": measure_classifier_step(m, vocabulary_size, max_length, batches, jit=True),
            }
            for name, m in encoders.items()
        },
        "masked_lm_step": {
            name: {
                "float32": measure_masked_lm_step(m, vocabulary_size, max_length, batches, mask_rate),
                "mixed_bfloat16": measure_masked_lm_step(
                    m, vocabulary_size, max_length, batches, mask_rate, "mixed_bfloat16"
                ),
            }
            for name, m in encoders.items()
        },
        "threads": measure_threads(encoders["configured"], vocabulary_size, max_length, batches),
    }


def measure_sparse_updates(
    model_config: ModelConfig, vocabulary_size: int, max_length: int, batches: list[np.ndarray], passes: int = 2
) -> dict:
    """The configured classifier's training step (with its n-gram table) under Keras' AdamW, under ``LazyAdamW``
    (``training.sparse_updates``) and with the n-gram table frozen (what no table update costs), side by side on the
    same batches: the best of ``passes`` timed passes after a warm-up pass that traces every shape."""
    import keras

    from pipeline.model.optimizers import LazyAdamW
    from pipeline.model.transformer import build_model

    config = model_config if model_config.ngram_max > 1 else dataclasses.replace(model_config, ngram_max=3)
    variants = {
        "AdamW (dense updates)": (keras.optimizers.AdamW, False),
        "LazyAdamW (training.sparse_updates)": (LazyAdamW, False),
        "n-gram table frozen": (keras.optimizers.AdamW, True),
    }
    steps = {}
    for name, (optimizer, frozen) in variants.items():
        keras.utils.set_random_seed(0)
        model = build_model(config, vocabulary_size, max_length, 2)
        model.get_layer("ngram_embedding").trainable = not frozen
        model.compile(
            optimizer=optimizer(1e-4, weight_decay=0.01, clipnorm=1.0),
            loss="sparse_categorical_crossentropy",
            jit_compile=False,
        )
        step = lambda batch, model=model: model.train_on_batch(batch, np.zeros(len(batch), np.int32))  # noqa: E731
        seconds = [_timed_passes(step, batches) for _ in range(passes)]
        steps[name] = {"ms_per_step": 1000 * min(seconds) / len(batches), "parameters": model.count_params()}
    dense, lazy, frozen = (steps[name]["ms_per_step"] for name in variants)
    return {
        "buckets": config.ngram_buckets,
        "steps": steps,
        "lazy_fraction_of_dense": lazy / dense,
        "frozen_fraction_of_dense": frozen / dense,
    }
