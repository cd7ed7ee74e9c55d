"""Benchmark stage (``make bench``): utilisation against this run's own GEMM peak, scoring speed and memory.

Reads:  ``data/tokenize/`` (train token ids, for real review lengths), ``data/ingest/test.parquet``
        (texts to score) and a model URI (default: the registered champion).
Writes: ``reports/bench.json`` and ``reports/bench.md``:
        - peak: ``tf.matmul`` GFLOP/s in float32 and bfloat16 for a 2048^3 square and for the GEMM
          shapes of the measured encoders;
        - training steps (classifier and masked-LM) for each measured encoder in float32,
          ``mixed_bfloat16`` and float32 with XLA, on length-bucketed batches of real train ids,
          warm-up (the first pass, which traces every batch width) excluded: non-padding tokens/s,
          achieved GFLOP/s (``pipeline.model.flops``) and the fraction of the same-run, same-precision peak;
        - TensorFlow thread settings (intra-op, inter-op) for the classifier step, each in a fresh process;
        - the padding fraction of full-width and of length-bucketed batches;
        - scoring: the model alone (compiled, bucketed) against the eager per-batch path, tokenization
          alone, a CSV end to end, and the peak memory of ``score`` for N and 10 x N rows;
        - n-grams: the configured encoder's model-alone scoring rate without and with hashed n-gram embeddings.

Figures are ratios measured in one run: absolute times on these shared machines vary 2x between runs.
"""

from __future__ import annotations

import multiprocessing
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import Config, ModelConfig
from pipeline.core.catalog import require_output
from pipeline.core.errors import InputError
from pipeline.core.files import atomic_write_json, atomic_write_text, split_table
from pipeline.model.flops import EncoderShape, batch_flops, classifier_forward_flops, masked_lm_forward_flops
from pipeline.runtime.batching import TRAINING_LENGTH_MULTIPLE, batch_width, bucketed_batches, padding_fraction
from pipeline.stages.score.csv_file import score_csv
from pipeline.stages.tokenize.outputs import load_split
from pipeline.text.conventions import PAD_ID
from pipeline.text.wordpiece import TextEncoder

MEASURED_BATCHES = 8
# The encoders measured besides the configured one: the one-block width-64 model that was the
# default before pretraining and n-grams, and the pretraining candidate (both on tokens alone).
REFERENCE_ENCODERS = {
    "width 64 x 1 block": ModelConfig(hidden_dim=64, num_layers=1, num_heads=2, intermediate_dim=128, ngram_max=1),
    "width 256 x 2 blocks": ModelConfig(hidden_dim=256, num_layers=2, num_heads=4, intermediate_dim=1024,
                                        ngram_max=1),
}
THREAD_SETTINGS = ((0, 0), (2, 1), (1, 2))


def measured_encoders(model: ModelConfig) -> dict[str, ModelConfig]:
    """The configured encoder plus each reference encoder of another shape (an identical one is measured once)."""
    shape = lambda m: (m.hidden_dim, m.num_layers, m.num_heads, m.intermediate_dim)  # noqa: E731
    return {"configured": model, **{name: reference for name, reference in REFERENCE_ENCODERS.items()
                                    if shape(reference) != shape(model)}}  # (intra-op, inter-op); 0 lets TensorFlow choose


# --------------------------------------------------------------------------- measurements


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
    return [ids[rows, :batch_width(lengths[rows].max(), TRAINING_LENGTH_MULTIPLE, ids.shape[1])] for rows in batches]


def _timed_passes(step, batches) -> float:
    """Seconds of the second pass over ``batches``; the first traces every shape (warm-up)."""
    for batch in batches:
        step(batch)
    started = time.perf_counter()
    for batch in batches:
        step(batch)
    return time.perf_counter() - started


def measure_classifier_step(model_config: ModelConfig, vocabulary_size: int, max_length: int,
                            batches: list[np.ndarray], policy: str = "float32", jit: bool = False) -> dict:
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


def measure_masked_lm_step(model_config: ModelConfig, vocabulary_size: int, max_length: int,
                           batches: list[np.ndarray], mask_rate: float, policy: str = "float32") -> dict:
    import keras

    from pipeline.model.transformer import build_masked_lm
    from pipeline.stages.pretrain.backbone import mask_generator

    masked = [{name: np.asarray(value) for name, value in mask_generator(vocabulary_size, batch.shape[1], mask_rate)(batch).items()}
              for batch in batches]
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = build_masked_lm(model_config, vocabulary_size, max_length)
        model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

        def step(inputs):
            model.train_on_batch({"token_ids": inputs["token_ids"], "mask_positions": inputs["mask_positions"]},
                                 inputs["mask_ids"], sample_weight=inputs["mask_weights"])

        seconds = _timed_passes(step, masked)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    shape = EncoderShape.from_config(model_config, vocabulary_size)
    flops = sum(batch_flops(masked_lm_forward_flops(shape, m["token_ids"].shape[1], m["mask_positions"].shape[1]),
                            len(m["token_ids"]), training=True) for m in masked)
    return _rates(batches, seconds, flops)


def _rates(batches: list[np.ndarray], seconds: float, flops: int) -> dict:
    tokens = sum(int((b != PAD_ID).sum()) for b in batches)
    rows = sum(len(b) for b in batches)
    return {"seconds": seconds, "tokens_per_second": tokens / seconds, "rows_per_second": rows / seconds,
            "gflops": flops / seconds / 1e9, "ms_per_step": 1000 * seconds / len(batches)}


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
                _classifier_step_with_threads, intra, inter, model_config, vocabulary_size, max_length, batches).result()
    return results


def _score_in_fresh_process(config: Config, input_path: str, output_path: str, model_uri: str) -> dict:
    summary = score_csv(config, input_path, output_path, model_uri=model_uri)
    return {**summary, "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (``VmHWM``).

    Not ``getrusage``: on Linux a spawned child inherits the parent's ``ru_maxrss`` across
    fork and exec, so a child of a large bench process would report the parent's peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def score_peak_memory(config: Config, input_path: Path, output_path: Path, model_uri: str) -> dict:
    """Run ``score`` in a new interpreter and return its summary plus peak RSS in MiB (its errors re-raised here)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_score_in_fresh_process, config, str(input_path), str(output_path), model_uri).result()


def measure_scoring(config: Config, model_uri: str, texts: pd.Series, repeat: int) -> dict:
    from pipeline.model.classifiers import load_classifier, predict_ids
    from pipeline.stages.evaluate.scorecard import transformer_of

    champion = load_classifier(model_uri)
    classifier = transformer_of(champion)
    if classifier is None:
        raise InputError(f"{model_uri} is an NBSVM model without a Transformer: pass a Transformer or fused model "
                         "with --model (MODEL=) to measure the Transformer's scoring path")
    results: dict = {"model_kind": champion.kind}
    encoder = classifier.encoder
    for encode in (encoder.encode, encoder.encode_reference):  # warm-up
        encode(texts[:64].tolist())
    started = time.perf_counter()
    reference = encoder.encode_reference(texts.tolist())
    results["tokenize_reference_rows_per_second"] = len(texts) / (time.perf_counter() - started)
    started = time.perf_counter()
    ids = encoder.encode(texts.tolist())
    results["tokenize_rows_per_second"] = len(texts) / (time.perf_counter() - started)
    results["tokenize_rows_differing_from_reference"] = int((ids != reference).any(axis=1).sum())
    predict_ids(classifier.model, ids)  # warm-up: compiles the forward pass for every batch width
    for name, compiled in (("model_only_rows_per_second", True), ("model_only_eager_rows_per_second", False)):
        started = time.perf_counter()
        predict_ids(classifier.model, ids, compiled=compiled)
        results[name] = len(texts) / (time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small, big = tmp / "reviews.csv", tmp / "reviews_big.csv"
        pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(small, index=False)
        pd.DataFrame({"id": range(len(texts) * repeat), "text": pd.concat([texts] * repeat)}).to_csv(big, index=False)
        started = time.perf_counter()
        summary = score_csv(config, small, tmp / "scored.csv", model_uri=model_uri)
        elapsed = time.perf_counter() - started
        results["score_csv_rows_per_second"] = summary["rows"] / elapsed
        results["score_csv_fraction_of_model_only"] = (results["score_csv_rows_per_second"]
                                                       / results["model_only_rows_per_second"])
        # like for like with the model-alone rate, which is measured on a loaded model
        results["score_csv_streaming_rows_per_second"] = summary["rows"] / (elapsed - summary["load_seconds"])
        results["score_csv_streaming_fraction_of_model_only"] = (results["score_csv_streaming_rows_per_second"]
                                                                 / results["model_only_rows_per_second"])
        transformer_run = getattr(champion, "transformer_run_id", None)
        if transformer_run:  # a fused model: its CSV rate against its own Transformer's, side by side
            alone = score_csv(config, small, tmp / "scored_transformer.csv", model_uri=f"runs:/{transformer_run}/model")
            fused = score_csv(config, small, tmp / "scored_fused.csv", model_uri=model_uri)
            results["fusion"] = {
                "transformer_csv_rows_per_second": alone["rows"] / (alone["seconds"] - alone["load_seconds"]),
                "fused_csv_rows_per_second": fused["rows"] / (fused["seconds"] - fused["load_seconds"])}
            results["fusion"]["fused_fraction_of_transformer_csv"] = (
                results["fusion"]["fused_csv_rows_per_second"] / results["fusion"]["transformer_csv_rows_per_second"])
        results["fresh_process"] = []  # what `make score` costs a user: a new process, model load and compiling included
        for path in (small, big):
            measured = score_peak_memory(config, path, tmp / f"scored_{path.stem}.csv", model_uri)
            results["fresh_process"].append({
                "rows": measured["rows"], "peak_rss_mb": round(measured["peak_rss_mb"], 1),
                "rows_per_second": measured["rows"] / measured["seconds"],
                "fraction_of_model_only": measured["rows"] / measured["seconds"] / results["model_only_rows_per_second"],
                "startup_seconds": measured["startup_seconds"], "load_seconds": measured["load_seconds"]})
    return results


def measure_ngram_scoring(model_config: ModelConfig, vocabulary_size: int, max_length: int, ids: np.ndarray,
                          ngram_max: int = 3, passes: int = 2) -> dict:
    """Model-alone scoring rate (``predict_ids``, compiled and bucketed, as ``make score`` runs it) of the configured
    encoder without and with hashed n-gram embeddings, side by side on the same token ids. The weights do not change
    the work, so both are built fresh; each rate is the best of ``passes`` passes after a warm-up pass."""
    import dataclasses

    import keras

    from pipeline.model.classifiers import predict_ids
    from pipeline.model.transformer import build_model

    ngram_max = model_config.ngram_max if model_config.ngram_max > 1 else ngram_max
    variants = {"tokens": dataclasses.replace(model_config, ngram_max=1),
                f"tokens + 2..{ngram_max}-grams": dataclasses.replace(model_config, ngram_max=ngram_max)}
    rates = {}
    for name, variant in variants.items():
        keras.utils.set_random_seed(0)
        model = build_model(variant, vocabulary_size, max_length, 2)
        predict_ids(model, ids)  # warm-up: compiles every batch width
        seconds = []
        for _ in range(passes):
            started = time.perf_counter()
            predict_ids(model, ids)
            seconds.append(time.perf_counter() - started)
        rates[name] = {"rows_per_second": len(ids) / min(seconds), "parameters": model.count_params()}
    plain, with_ngrams = rates.values()
    return {"rows": len(ids), "buckets": model_config.ngram_buckets, "models": rates,
            "ngram_fraction_of_tokens_only": with_ngrams["rows_per_second"] / plain["rows_per_second"]}


def measure_sparse_updates(model_config: ModelConfig, vocabulary_size: int, max_length: int,
                           batches: list[np.ndarray], passes: int = 2) -> dict:
    """The configured classifier's training step (with its n-gram table) under Keras' AdamW, under ``LazyAdamW``
    (``training.sparse_updates``) and with the n-gram table frozen (what no table update costs), side by side on the
    same batches: the best of ``passes`` timed passes after a warm-up pass that traces every shape."""
    import dataclasses

    import keras

    from pipeline.model.optimizers import LazyAdamW
    from pipeline.model.transformer import build_model

    config = model_config if model_config.ngram_max > 1 else dataclasses.replace(model_config, ngram_max=3)
    variants = {"AdamW (dense updates)": (keras.optimizers.AdamW, False),
                "LazyAdamW (training.sparse_updates)": (LazyAdamW, False),
                "n-gram table frozen": (keras.optimizers.AdamW, True)}
    steps = {}
    for name, (optimizer, frozen) in variants.items():
        keras.utils.set_random_seed(0)
        model = build_model(config, vocabulary_size, max_length, 2)
        model.get_layer("ngram_embedding").trainable = not frozen
        model.compile(optimizer=optimizer(1e-4, weight_decay=0.01, clipnorm=1.0),
                      loss="sparse_categorical_crossentropy", jit_compile=False)
        step = lambda batch: model.train_on_batch(batch, np.zeros(len(batch), np.int32))  # noqa: E731
        seconds = [_timed_passes(step, batches) for _ in range(passes)]
        steps[name] = {"ms_per_step": 1000 * min(seconds) / len(batches), "parameters": model.count_params()}
    dense, lazy, frozen = (steps[name]["ms_per_step"] for name in variants)
    return {"buckets": config.ngram_buckets, "steps": steps, "lazy_fraction_of_dense": lazy / dense,
            "frozen_fraction_of_dense": frozen / dense}


# --------------------------------------------------------------------------- report


def utilisation_rows(results: dict) -> list[dict]:
    """One row per training workload with its fraction of the same-run, same-precision square-GEMM peak."""
    rows = []
    for workload in ("classifier_step", "masked_lm_step"):
        for encoder, variants in results.get(workload, {}).items():
            for variant, rates in variants.items():
                precision = "bfloat16" if "bfloat16" in variant else "float32"
                peak = results["peak"][precision]["square_2048"]
                rows.append({"workload": workload.replace("_", " "), "encoder": encoder, "variant": variant,
                             "ms_per_step": rates["ms_per_step"], "tokens_per_second": rates["tokens_per_second"],
                             "gflops": rates["gflops"], "fraction_of_peak": rates["gflops"] / peak,
                             "fraction_of_float32_peak": rates["gflops"] / results["peak"]["float32"]["square_2048"]})
    return rows


def markdown_report(results: dict) -> str:
    peak = results["peak"]
    lines = ["# Benchmark (one run; compare ratios, not absolute times)", "",
             f"Same-run GEMM peak (2048^3 square): float32 {peak['float32']['square_2048']:.0f} GFLOP/s, "
             f"bfloat16 {peak['bfloat16']['square_2048']:.0f} GFLOP/s.", "",
             "| workload | encoder | variant | ms/step | tokens/s | GFLOP/s | of same-precision peak | of float32 peak |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in utilisation_rows(results):
        lines.append(f"| {row['workload']} | {row['encoder']} | {row['variant']} | {row['ms_per_step']:.0f} | "
                     f"{row['tokens_per_second']:,.0f} | {row['gflops']:.1f} | {row['fraction_of_peak']:.0%} | "
                     f"{row['fraction_of_float32_peak']:.0%} |")
    lines += ["", "| GEMM | float32 GFLOP/s | bfloat16 GFLOP/s |", "| --- | --- | --- |"]
    for name in peak["float32"]:
        lines.append(f"| {name} | {peak['float32'][name]:.0f} | {peak['bfloat16'][name]:.0f} |")
    if "threads" in results:
        lines += ["", "| TF threads (classifier step, configured encoder, float32) | ms/step | tokens/s |",
                  "| --- | --- | --- |"]
        for name, rates in results["threads"].items():
            lines.append(f"| {name} | {rates['ms_per_step']:.0f} | {rates['tokens_per_second']:,.0f} |")
    padding = results["padding"]
    lines += ["", f"Padding: {padding['full_width']:.1%} of computed positions at full width, "
              f"{padding['bucketed']:.1%} with length-bucketed batches.", ""]
    scoring = results.get("scoring")
    if scoring:
        lines += ["| scoring | rows/s |", "| --- | --- |"]
        for key in ("tokenize_reference_rows_per_second", "tokenize_rows_per_second",
                    "model_only_eager_rows_per_second", "model_only_rows_per_second",
                    "score_csv_rows_per_second", "score_csv_streaming_rows_per_second"):
            lines.append(f"| {key.replace('_rows_per_second', '').replace('_', ' ')} | {scoring[key]:,.0f} |")
        lines += ["", f"Tokenizer: {scoring['tokenize_rows_per_second'] / scoring['tokenize_reference_rows_per_second']:.2f}x "
                  "KerasHub's on every whole text (`encode` with its exact shortcuts against `encode_reference`), "
                  f"{scoring['tokenize_rows_differing_from_reference']:,} rows with other ids.",
                  "", "In this process, with the model already loaded and compiled as for the model-alone rate, "
                  f"CSV scoring runs at {scoring['score_csv_fraction_of_model_only']:.0%} of the model-alone rate "
                  f"including its model load, {scoring['score_csv_streaming_fraction_of_model_only']:.0%} after it; "
                  "compiled model alone is "
                  f"{scoring['model_only_rows_per_second'] / scoring['model_only_eager_rows_per_second']:.1f}x the eager "
                  "path. Peak memory of `score`: " + ", ".join(f"{m['peak_rss_mb']:,.0f} MiB for {m['rows']:,} rows"
                                                                for m in scoring.get("fresh_process", [])),
                  ""]
        fusion = scoring.get("fusion")
        if fusion:
            lines += [f"The fused model scores a CSV at {fusion['fused_csv_rows_per_second']:,.0f} rows/s after its load, "
                      f"{fusion['fused_fraction_of_transformer_csv']:.0%} of its Transformer alone "
                      f"({fusion['transformer_csv_rows_per_second']:,.0f} rows/s), measured side by side.", ""]
        fresh = scoring.get("fresh_process", [])
        if fresh:
            lines += ["`score` in a new process, as `make score` runs it (rows/s over the whole call: model load, "
                      "compiling, reading, scoring and writing; start-up is the interpreter, imports and model load "
                      "before the first row is read): " + "; ".join(
                          f"{m['rows']:,} rows {m['rows_per_second']:,.0f} rows/s = {m['fraction_of_model_only']:.0%} "
                          f"of the model-alone rate, start-up {m['startup_seconds']:.1f} s" for m in fresh),
                      ""]
    ngrams = results.get("ngram_scoring")
    if ngrams:
        lines += [f"| model alone, {ngrams['rows']:,} test rows, {ngrams['buckets']:,} n-gram buckets | rows/s | "
                  "parameters |", "| --- | --- | --- |"]
        for name, rates in ngrams["models"].items():
            lines.append(f"| {name} | {rates['rows_per_second']:,.0f} | {rates['parameters']:,} |")
        lines += ["", f"With hashed n-grams the model alone scores at {ngrams['ngram_fraction_of_tokens_only']:.0%} of "
                  "the tokens-only rate, measured side by side.", ""]
    sparse = results.get("sparse_updates")
    if sparse:
        lines += [f"| training step, {sparse['buckets']:,} n-gram buckets | ms/step |", "| --- | --- |"]
        lines += [f"| {name} | {step['ms_per_step']:,.0f} |" for name, step in sparse["steps"].items()]
        lines += ["", f"LazyAdamW's step takes {sparse['lazy_fraction_of_dense']:.2f}x the time of Keras' AdamW's; "
                  f"with the table frozen (no update at all) {sparse['frozen_fraction_of_dense']:.2f}x.", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- stage entry point


def run(config: Config, model_uri: str | None, rows: int, repeat: int, sections: tuple[str, ...] = ("all",)) -> dict:
    from pipeline.tracking import champion_uri, setup_tracking

    if rows < 1 or repeat < 1:
        raise InputError(f"--rows and --repeat must be positive, got {rows} and {repeat}")
    tokenize_dir = require_output(config, "tokenize")
    test_path = require_output(config, "ingest") / split_table("test")
    everything = "all" in sections
    encoder = TextEncoder.load(tokenize_dir)
    train_ids = np.asarray(load_split(tokenize_dir, "train")[0])
    vocabulary_size, max_length = encoder.vocabulary_size, encoder.settings.max_sequence_length
    encoders = measured_encoders(config.model)
    batch_size = config.training.batch_size
    batches = sample_batches(train_ids, batch_size, MEASURED_BATCHES)
    lengths = (train_ids != PAD_ID).sum(axis=1)
    results: dict = {"batch_size": batch_size, "measured_batches": len(batches),
                     "padding": {"full_width": padding_fraction(lengths, [np.arange(len(lengths))], max_length,
                                                                max_length),
                                 "bucketed": padding_fraction(lengths, bucketed_batches(lengths, batch_size, 0),
                                                              TRAINING_LENGTH_MULTIPLE, max_length)}}
    results["peak"] = measure_peak(encoders, tokens=batch_size * 128)
    if everything or "train" in sections:
        results["classifier_step"] = {name: {"float32": measure_classifier_step(m, vocabulary_size, max_length, batches),
                                             "mixed_bfloat16": measure_classifier_step(m, vocabulary_size, max_length,
                                                                                       batches, "mixed_bfloat16"),
                                             "float32 + XLA": measure_classifier_step(m, vocabulary_size, max_length,
                                                                                      batches, jit=True)}
                                      for name, m in encoders.items()}
        rate = config.pretrain.mask_rate
        results["masked_lm_step"] = {name: {"float32": measure_masked_lm_step(m, vocabulary_size, max_length, batches,
                                                                              rate),
                                            "mixed_bfloat16": measure_masked_lm_step(m, vocabulary_size, max_length,
                                                                                     batches, rate, "mixed_bfloat16")}
                                     for name, m in encoders.items()}
        results["threads"] = measure_threads(encoders["configured"], vocabulary_size, max_length, batches)
    texts = pd.read_parquet(test_path, columns=["text"])["text"].head(rows)  # what both scoring sections score
    if everything or "score" in sections:
        setup_tracking(config)
        model_uri = model_uri or champion_uri(config)
        results["scoring"] = {"model_uri": model_uri, "rows": len(texts),
                              **measure_scoring(config, model_uri, texts, repeat)}
    if everything or "sparse" in sections:
        results["sparse_updates"] = measure_sparse_updates(config.model, vocabulary_size, max_length, batches)
    if everything or "ngrams" in sections:
        results["ngram_scoring"] = measure_ngram_scoring(config.model, vocabulary_size, max_length,
                                                         encoder.encode(texts.tolist()))
    json_path = atomic_write_json(config.reports_dir / "bench.json", results)
    md_path = atomic_write_text(config.reports_dir / "bench.md", markdown_report(results))
    best = max(utilisation_rows(results), key=lambda row: row["fraction_of_peak"], default=None)
    print(f"bench: read {len(train_ids):,} train rows from {tokenize_dir}/ and {test_path}; "
          + (f"best training step {best['fraction_of_peak']:.0%} of the same-run peak ({best['workload']}, "
             f"{best['encoder']}, {best['variant']}); " if best else "")
          + (f"CSV scoring {results['scoring']['score_csv_fraction_of_model_only']:.0%} of model-alone rate "
             f"({results['scoring']['score_csv_streaming_fraction_of_model_only']:.0%} after the model load); "
             if "scoring" in results else "")
          + f"wrote {md_path} and {json_path.name}")
    return results


def main(config: Config, args) -> None:
    run(config, args.model, args.rows, args.repeat, tuple(args.only or ("all",)))
