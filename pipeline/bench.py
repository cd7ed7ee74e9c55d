"""Benchmark stage (``make bench``): scoring throughput and memory, kept out of the test suite.

Reads:  ``data/ingest/test.parquet`` (the review texts to score) and a model URI
        (default: the registered champion).
Writes: ``reports/bench.json`` and one summary line:
        - rows/s of ``score`` on a CSV of the test reviews (CSV I/O + tokenization + model),
        - rows/s of the model alone on already-tokenized ids, and of tokenization alone,
        - peak resident memory of a fresh ``score`` process for a CSV of N rows and of 10 x N rows.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
import resource
import tempfile
import time
from pathlib import Path

import pandas as pd

from pipeline.artifacts import atomic_write_json
from pipeline.config import Config
from pipeline.errors import InputError
from pipeline.stages import require_output


def _score_in_fresh_process(config: Config, input_path: str, output_path: str, model_uri: str) -> dict:
    from pipeline import score

    summary = score.run(config, input_path, output_path, model_uri=model_uri)
    return {**summary, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def score_peak_memory(config: Config, input_path: Path, output_path: Path, model_uri: str) -> dict:
    """Run ``score`` in a new interpreter and return its summary plus peak RSS in MiB (its errors re-raised here)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_score_in_fresh_process, config, str(input_path), str(output_path), model_uri).result()


def run(config: Config, model_uri: str | None, rows: int, repeat: int) -> dict:
    from pipeline import score
    from pipeline.inference import load_classifier, predict_ids
    from pipeline.tracking import champion_uri, setup_tracking

    if rows < 1 or repeat < 1:
        raise InputError(f"--rows and --repeat must be positive, got {rows} and {repeat}")
    test_path = require_output(config, "ingest") / "test.parquet"
    setup_tracking(config)
    model_uri = model_uri or champion_uri(config)
    classifier = load_classifier(model_uri)
    texts = pd.read_parquet(test_path, columns=["text"])["text"].head(rows)
    results: dict = {"model_uri": model_uri, "rows": len(texts)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small, big = tmp / "reviews.csv", tmp / "reviews_big.csv"
        pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(small, index=False)
        pd.DataFrame({"id": range(len(texts) * repeat), "text": pd.concat([texts] * repeat)}).to_csv(big, index=False)

        started = time.perf_counter()
        summary = score.run(config, small, tmp / "scored.csv", model_uri=model_uri)
        results["score_csv_rows_per_second"] = summary["rows"] / (time.perf_counter() - started)

        started = time.perf_counter()
        ids = classifier.encoder.encode(texts.tolist())
        results["tokenize_rows_per_second"] = len(texts) / (time.perf_counter() - started)
        started = time.perf_counter()
        predict_ids(classifier.model, ids)
        results["model_only_rows_per_second"] = len(texts) / (time.perf_counter() - started)

        for name, path in (("small", small), ("big", big)):
            measured = score_peak_memory(config, path, tmp / f"scored_{name}.csv", model_uri)
            results[f"peak_rss_mb_{measured['rows']}_rows"] = round(measured["peak_rss_mb"], 1)
    atomic_write_json(config.reports_dir / "bench.json", results)
    print("bench: " + ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in results.items())
          + f"; wrote {config.reports_dir / 'bench.json'}")
    return results


def main(config: Config, args) -> None:
    run(config, args.model, args.rows, args.repeat)
