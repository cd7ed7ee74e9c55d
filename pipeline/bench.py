"""Benchmarks (``make bench``): scoring throughput and memory, kept out of the test suite.

Reads:  ``data/ingest/test.parquet`` (the review texts to score) and a model URI
        (default: the registered champion).
Writes: ``reports/bench.json`` and one summary line:
        - rows/s of ``score`` on a CSV of the test reviews (CSV I/O + tokenization + model),
        - rows/s of the model alone on already-tokenized ids, and of tokenization alone,
        - peak resident memory of a fresh ``score`` process for a CSV of N rows and of 10 x N rows.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from pipeline.artifacts import atomic_write_json
from pipeline.config import Config, load_config


def _score_in_fresh_process(config: Config, input_path: str, output_path: str, model_uri: str, queue) -> None:
    from pipeline import score

    summary = score.run(config, input_path, output_path, model_uri=model_uri)
    queue.put({**summary, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def score_peak_memory(config: Config, input_path: Path, output_path: Path, model_uri: str) -> dict:
    """Run ``score`` in a new interpreter and return its summary plus peak RSS in MiB."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_score_in_fresh_process,
                              args=(config, str(input_path), str(output_path), model_uri, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def run(config: Config, model_uri: str | None, rows: int, repeat: int) -> dict:
    from pipeline import score
    from pipeline.inference import load_classifier, predict_ids
    from pipeline.tracking import champion_uri, setup_tracking

    test_path = config.data_dir / "ingest" / "test.parquet"
    if not test_path.is_file():
        raise FileNotFoundError(f"no test split at {test_path}: run `make ingest` first")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--model", default=None, help="model URI (default: the registered champion)")
    parser.add_argument("--rows", type=int, default=25000, help="test reviews in the small CSV")
    parser.add_argument("--repeat", type=int, default=10, help="the big CSV is the small one repeated this often")
    args = parser.parse_args(argv)
    try:
        run(load_config(args.config, args.overrides), args.model, args.rows, args.repeat)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
