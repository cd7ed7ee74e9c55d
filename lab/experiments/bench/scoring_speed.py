"""Scoring measurements for ``make bench``: tokenization, the model alone (compiled against eager), a CSV end to
end in this process and in a fresh one (with its peak memory), and the model-alone rate with hashed n-grams.

Reads:  the model at a URI (an MLflow model) and the texts it is given.
Writes: only temporary CSV files, removed before each function returns.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import resource
import tempfile
import time
import typing
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from lab.experiments.bench.onnx_int8 import int8_graph, onnx_graph, predict_ids_onnx, session
from pipeline.config import ModelConfig, TrackingConfig
from pipeline.core.errors import InputError
from pipeline.core.files import folder_bytes
from pipeline.core.predictions import cascade_rows, from_probability_columns, fuse_probabilities
from pipeline.metrics import mcnemar_exact
from pipeline.model.explain import TOP_ITEMS
from pipeline.model.forward import predict_ids
from pipeline.runtime.backend import uses_tensorflow
from pipeline.stages.export.check import as_bytes
from pipeline.stages.score.csv_file import score_csv


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (``VmHWM``).

    Not ``getrusage``: on Linux a spawned child inherits the parent's ``ru_maxrss`` across
    fork and exec, so a child of a large bench process would report the parent's peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux


def _score_in_fresh_process(tracking: TrackingConfig, input_path: str, output_path: str, model_uri: str) -> dict:
    summary = score_csv(tracking, input_path, output_path, model_uri=model_uri)
    return {**summary, "peak_rss_mb": peak_rss_mb()}


def score_peak_memory(tracking: TrackingConfig, input_path: Path, output_path: Path, model_uri: str) -> dict:
    """Run ``score`` in a new interpreter and return its summary plus peak RSS in MiB (its errors re-raised here)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_score_in_fresh_process, tracking, str(input_path), str(output_path), model_uri).result()


def measure_model_alone(classifier, texts: pd.Series) -> dict:
    """Tokenizer rates (``encode`` against ``encode_reference``, and the rows where they differ) and the model-alone
    scoring rate, compiled and eager, each after a warm-up."""

    results = {}
    text_tokenizer = classifier.text_tokenizer
    for encode in (text_tokenizer.encode, text_tokenizer.encode_reference):  # warm-up
        encode(texts[:64].tolist())
    started = time.perf_counter()
    reference = text_tokenizer.encode_reference(texts.tolist())
    results["tokenize_reference_rows_per_second"] = len(texts) / (time.perf_counter() - started)
    started = time.perf_counter()
    ids = text_tokenizer.encode(texts.tolist())
    results["tokenize_rows_per_second"] = len(texts) / (time.perf_counter() - started)
    results["tokenize_rows_differing_from_reference"] = int((ids != reference).any(axis=1).sum())
    predict_ids(classifier.model, ids)  # warm-up: compiles the forward pass for every batch width
    for name, compiled in (("model_only_rows_per_second", True), ("model_only_eager_rows_per_second", False)):
        started = time.perf_counter()
        predict_ids(classifier.model, ids, compiled=compiled)
        results[name] = len(texts) / (time.perf_counter() - started)
    return results


def measure_csv_in_process(
    tracking: TrackingConfig, model_uri: str, csv_path: Path, tmp: Path, model_only: float
) -> dict:
    """``score_csv``'s rate on ``csv_path`` in this process, with and without its model load, as rates and as
    fractions of the ``model_only`` rate."""
    started = time.perf_counter()
    summary = score_csv(tracking, csv_path, tmp / "scored.csv", model_uri=model_uri)
    elapsed = time.perf_counter() - started
    results = {"score_csv_rows_per_second": summary["rows"] / elapsed}
    results["score_csv_fraction_of_model_only"] = results["score_csv_rows_per_second"] / model_only
    # like for like with the model-alone rate, which is measured on a loaded model
    results["score_csv_streaming_rows_per_second"] = summary["rows"] / (elapsed - summary["load_seconds"])
    results["score_csv_streaming_fraction_of_model_only"] = results["score_csv_streaming_rows_per_second"] / model_only
    return results


def measure_fusion_csv(
    tracking: TrackingConfig, model_uri: str, transformer_run: str, csv_path: Path, tmp: Path
) -> dict:
    """A fused model's CSV rate after its load against its own Transformer's, side by side."""
    alone = score_csv(tracking, csv_path, tmp / "scored_transformer.csv", model_uri=f"runs:/{transformer_run}/model")
    fused = score_csv(tracking, csv_path, tmp / "scored_fused.csv", model_uri=model_uri)
    fusion = {
        "transformer_csv_rows_per_second": alone["rows"] / (alone["seconds"] - alone["load_seconds"]),
        "fused_csv_rows_per_second": fused["rows"] / (fused["seconds"] - fused["load_seconds"]),
    }
    fusion["fused_fraction_of_transformer_csv"] = (
        fusion["fused_csv_rows_per_second"] / fusion["transformer_csv_rows_per_second"]
    )
    return fusion


EXPLAIN_ROWS = 256  # rows scored with and without explanations (integrated gradients cost many passes a row)


def measure_explain_csv(tracking: TrackingConfig, model_uri: str, texts: pd.Series, tmp: Path) -> dict:
    """``make score`` with and without ``EXPLAIN=1`` on the same ``EXPLAIN_ROWS`` texts, side by side: rows/s after
    the model load and their ratio, after one pass without that loads the model and compiles its forward pass (as a
    long file would have)."""
    path = tmp / "explain.csv"
    pd.DataFrame({"text": texts.head(EXPLAIN_ROWS)}).to_csv(path, index=False)
    score_csv(tracking, path, tmp / "warm_up.csv", model_uri=model_uri)
    rates = {}
    for name, top in (("plain", 0), ("explained", TOP_ITEMS)):
        summary = score_csv(tracking, path, tmp / f"scored_{name}.csv", model_uri=model_uri, explain_top=top)
        rates[f"{name}_rows_per_second"] = summary["rows"] / (summary["seconds"] - summary["load_seconds"])
    rates["rows"] = int(min(len(texts), EXPLAIN_ROWS))
    rates["explained_fraction_of_plain"] = rates["explained_rows_per_second"] / rates["plain_rows_per_second"]
    return rates


def measure_fresh_process(
    tracking: TrackingConfig, model_uri: str, csv_paths: list[Path], tmp: Path, model_only: float
) -> list[dict]:
    """What ``make score`` costs a user: for each CSV a new process, model load and compiling included, its rate,
    start-up and peak memory."""
    measurements = []
    for path in csv_paths:
        measured = score_peak_memory(tracking, path, tmp / f"scored_{path.stem}.csv", model_uri)
        measurements.append(
            {
                "rows": measured["rows"],
                "peak_rss_mb": round(measured["peak_rss_mb"], 1),
                "rows_per_second": measured["rows"] / measured["seconds"],
                "fraction_of_model_only": measured["rows"] / measured["seconds"] / model_only,
                "startup_seconds": measured["startup_seconds"],
                "load_seconds": measured["load_seconds"],
            }
        )
    return measurements


def measure_scoring(tracking: TrackingConfig, model_uri: str, texts: pd.Series, repeat: int) -> dict:
    """Every scoring rate of the model at ``model_uri`` on ``texts``: tokenizer and model alone, a CSV of them in this
    process (and, for a fused model, against its Transformer), and in a fresh process for them and ``repeat`` x them."""
    from pipeline.model.classifiers import load_classifier

    champion = load_classifier(model_uri)
    classifier = champion.transformer_part
    if classifier is None:
        raise InputError(
            f"{model_uri} is an NBSVM model without a Transformer: pass a Transformer or fused model "
            "with --model (MODEL=) to measure the Transformer's scoring path"
        )
    results: dict = {"model_kind": champion.kind, **measure_model_alone(classifier, texts)}
    model_only = results["model_only_rows_per_second"]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        small, big = tmp / "reviews.csv", tmp / "reviews_big.csv"
        pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(small, index=False)
        pd.DataFrame({"id": range(len(texts) * repeat), "text": pd.concat([texts] * repeat)}).to_csv(big, index=False)
        results.update(measure_csv_in_process(tracking, model_uri, small, tmp, model_only))
        transformer_run = getattr(champion, "transformer_run_id", None)
        if transformer_run:  # a fused model: its CSV rate against its own Transformer's, side by side
            results["fusion"] = measure_fusion_csv(tracking, model_uri, transformer_run, small, tmp)
        results["explain"] = measure_explain_csv(tracking, model_uri, texts, tmp)
        results["fresh_process"] = measure_fresh_process(tracking, model_uri, [small, big], tmp, model_only)
    return results


class NoTransformer(InputError):
    """The model asked for holds no Transformer (NBSVM alone)."""


def measure_int8(model_uri: str, texts: pd.Series, labels: np.ndarray) -> dict:
    """The Transformer of the model at ``model_uri`` scored alone, side by side on the same rows: float32 on the
    product's compiled path (``predict_ids``, as ``make score`` runs it), Keras' post-training int8
    (``model.quantize("int8")``: int8 weights, activations quantized per call) on the same path, and its ONNX graph
    run by ONNX Runtime in float32 and with dynamic int8 weights (``onnx_int8``; TensorFlow backend).
    Each: rows/s after a warm-up pass and accuracy; each other than float32: McNemar's test against it, the largest
    difference of a probability and the rows whose label changes."""
    import keras

    from pipeline.model.classifiers import load_classifier

    floats = load_classifier(model_uri).transformer_part
    if floats is None:
        raise NoTransformer(f"{model_uri} is an NBSVM model without a Transformer to quantize")
    # a copy: the loaded model is shared with every other user of this URI in the process
    quantized = keras.models.clone_model(floats.model)
    quantized.set_weights(floats.model.get_weights())
    with warnings.catch_warnings():  # Keras warns once per layer it has no int8 form for (norms, pooling, ...)
        warnings.filterwarnings("ignore", message=r"Layer .* does not have a `quantize` method")
        quantized.quantize("int8")
    ids = floats.text_tokenizer.encode(texts.tolist())
    forwards = {
        "float32": lambda rows: predict_ids(floats.model, rows, compiled=True),
        "keras_int8": lambda rows: predict_ids(quantized, rows, compiled=True),
    }
    if uses_tensorflow():
        graph = onnx_graph(floats.model)
        for name, variant in (("onnx_float32", graph), ("onnx_int8", int8_graph(graph))):
            forwards[name] = functools.partial(predict_ids_onnx, session(variant))
    results: dict = {"rows": len(texts), "variants": {}}
    probabilities = {}
    for name, forward in forwards.items():
        forward(ids)  # warm-up: compiles every batch width once, or lets ONNX Runtime plan its buffers
        started = time.perf_counter()
        probabilities[name] = forward(ids)
        results["variants"][name] = {
            "rows_per_second": len(ids) / (time.perf_counter() - started),
            "accuracy": float((probabilities[name].argmax(axis=1) == labels).mean()),
        }
    reference = probabilities["float32"]
    for name, measured in results["variants"].items():
        if name != "float32":
            measured.update(
                mcnemar=mcnemar_exact(reference.argmax(axis=1) == labels, probabilities[name].argmax(axis=1) == labels),
                max_probability_difference=float(np.abs(probabilities[name] - reference).max()),
                labels_changed=int((probabilities[name].argmax(axis=1) != reference.argmax(axis=1)).sum()),
                speedup=measured["rows_per_second"] / results["variants"]["float32"]["rows_per_second"],
            )
    return results


class NoCascade(InputError):
    """The model asked for is not a cascaded fusion (``compare.cascade_share`` below 1)."""


def scored_probabilities(path: Path, labels: list[str]) -> np.ndarray:
    """The ``[N, k]`` probabilities a scored CSV holds (``make score``'s output columns)."""
    return from_probability_columns(pd.read_csv(path), labels)


def measure_cascade(tracking: TrackingConfig, model_uri: str, texts: pd.Series, labels: np.ndarray) -> dict:
    """``make score`` (``score_csv``) on the same CSV, side by side, for a cascaded fusion, its Transformer alone (the
    float32 model that would read every text) and its NBSVM alone (the lexical part, the default config's kind of
    champion): rows/s after the model load (each after a warm-up call on the first rows that loads it and compiles its
    forward pass) and accuracy. Against the fusion of every text (computed from the two parts' scored files and the
    fusion's weights): the share of rows the Transformer read, McNemar's test, the labels that change and the largest
    difference of a probability on the rows it read."""
    from pipeline.model.classifiers import load_classifier
    from pipeline.model.kinds.fusion_classifier import FusedClassifier

    loaded = load_classifier(model_uri)
    if getattr(loaded, "cascade_threshold", None) is None:
        raise NoCascade(f"{model_uri} is not a cascaded fusion (compare.cascade_share below 1 makes one)")
    cascade = typing.cast(FusedClassifier, loaded)
    models = {
        "cascade": model_uri,
        "transformer": f"runs:/{cascade.transformer_run_id}/model",
        "nbsvm": f"runs:/{cascade.lexical_run_id}/model",
    }
    results: dict = {"rows": len(texts), "threshold": cascade.cascade_threshold, "variants": {}}
    probabilities = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        small, csv_path = tmp / "warm_up.csv", tmp / "reviews.csv"
        pd.DataFrame({"text": texts.head(64)}).to_csv(small, index=False)
        pd.DataFrame({"text": texts}).to_csv(csv_path, index=False)
        for name, uri in models.items():
            score_csv(tracking, small, tmp / f"warm_up_{name}.csv", model_uri=uri)
            summary = score_csv(tracking, csv_path, tmp / f"scored_{name}.csv", model_uri=uri)
            probabilities[name] = scored_probabilities(tmp / f"scored_{name}.csv", cascade.labels)
            results["variants"][name] = {
                "model_uri": uri,
                "rows_per_second": summary["rows"] / (summary["seconds"] - summary["load_seconds"]),
                "load_seconds": summary["load_seconds"],
                "accuracy": float((probabilities[name].argmax(axis=1) == labels).mean()),
            }
    every_text = fuse_probabilities(
        probabilities["transformer"], probabilities["nbsvm"], cascade.row_weights(texts.tolist())
    )
    read = cascade_rows(probabilities["nbsvm"], cascade.cascade_threshold)
    answer = probabilities["cascade"]
    results["every_text"] = {
        "accuracy": float((every_text.argmax(axis=1) == labels).mean()),
        "transformer_share": float(read.mean()),
        "mcnemar": mcnemar_exact(every_text.argmax(axis=1) == labels, answer.argmax(axis=1) == labels),
        "labels_changed": int((every_text.argmax(axis=1) != answer.argmax(axis=1)).sum()),
        "max_difference_where_read": float(np.abs(every_text[read] - answer[read]).max()) if read.any() else 0.0,
    }
    rates = {name: measured["rows_per_second"] for name, measured in results["variants"].items()}
    results["cascade_over_transformer"] = rates["cascade"] / rates["transformer"]
    results["cascade_fraction_of_nbsvm"] = rates["cascade"] / rates["nbsvm"]
    return results


def measure_ngram_scoring(
    model_config: ModelConfig,
    vocabulary_size: int,
    max_length: int,
    ids: np.ndarray,
    ngram_max: int = 3,
    passes: int = 2,
) -> dict:
    """Model-alone scoring rate (``predict_ids``, compiled and bucketed, as ``make score`` runs it) of the configured
    encoder without and with hashed n-gram embeddings, side by side on the same token ids. The weights do not change
    the work, so both are built fresh; each rate is the best of ``passes`` passes after a warm-up pass."""
    import keras

    from pipeline.model.transformer import build_model

    ngram_max = model_config.ngram_max if model_config.ngram_max > 1 else ngram_max
    variants = {
        "tokens": dataclasses.replace(model_config, ngram_max=1),
        f"tokens + 2..{ngram_max}-grams": dataclasses.replace(model_config, ngram_max=ngram_max),
    }
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
    return {
        "rows": len(ids),
        "buckets": model_config.ngram_buckets,
        "models": rates,
        "ngram_fraction_of_tokens_only": with_ngrams["rows_per_second"] / plain["rows_per_second"],
    }


def measure_export(model_uri: str, texts: pd.Series, graph_rows: int = 256, score_rows: int = 2048) -> dict:
    """The exported graph (``make export``) of the model at ``model_uri``, called with requests of ``graph_rows``
    texts, against its pyfunc model in ``make score``'s chunks of ``score_rows``, side by side on ``texts``, each after
    one warm-up call; the SavedModel's size on disk and the time to write it."""
    import tensorflow as tf

    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.graph import SIGNATURE, write_saved_model

    classifier = load_classifier(model_uri)
    values = texts.tolist()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        folder = write_saved_model(classifier, Path(tmp) / "saved_model")
        write_seconds = time.perf_counter() - started
        size = folder_bytes(folder)
        signature = tf.saved_model.load(str(folder)).signatures[SIGNATURE]
        rates = {}
        for name, rows, answer in (
            ("graph", graph_rows, lambda batch: signature(text=tf.constant(as_bytes(batch), dtype=tf.string))),
            (
                "pyfunc",
                score_rows,
                lambda batch: classifier.predict(None, pd.DataFrame({"text": pd.Series(batch, dtype=object)})),
            ),
        ):
            chunks = [values[start : start + rows] for start in range(0, len(values), rows)]
            answer(chunks[0])  # warm-up: traces and compiles
            started = time.perf_counter()
            for batch in chunks:
                answer(batch)
            rates[f"{name}_rows_per_second"] = len(values) / (time.perf_counter() - started)
    return {
        "model_uri": model_uri,
        "model_kind": classifier.kind,
        "rows": len(values),
        "graph_request_rows": graph_rows,
        "score_chunk_rows": score_rows,
        **rates,
        "graph_fraction_of_pyfunc": rates["graph_rows_per_second"] / rates["pyfunc_rows_per_second"],
        "saved_model_bytes": size,
        "write_seconds": write_seconds,
    }
