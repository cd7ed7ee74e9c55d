"""``make evaluate``: score the test and validation splits with a trained run and log ``test_`` metrics to it.

Reads:  ``data/ingest/{test,val}.parquet`` and the run's MLflow pyfunc model (its own Keras model and
        tokenizer, so the texts go through exactly the preprocessing of training; any model the
        pipeline logs works, a fused or NBSVM run too).
Writes: to the same MLflow run, ``test_*`` metrics (for more than two classes also per-class
        precision/recall/F1, macro and weighted F1, one-vs-rest ROC AUC), ``val_accuracy``, plots
        (confusion matrix, ROC, reliability diagram, accuracy by review length, attention heatmaps) and
        the 50 most confident errors; ``behaviour_*`` pass rates of the CheckList-style behaviour tests
        (``pipeline.behaviour``); locally ``reports/<run_id>/`` with ``metrics.json``, the plots,
        ``errors.csv``, ``test_predictions.parquet``, ``val_predictions.parquet``, ``behaviour.md`` and
        ``behaviour.csv`` (``pipeline.evaluation``).
"""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from pipeline.artifacts import METRICS_FILE, TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, split_table, token_counts_file
from pipeline.config import Config
from pipeline.evaluation import behaviour_summary, evaluate_model, log_evaluation
from pipeline.inference import load_classifier
from pipeline.stages import require_output, stage_dir
from pipeline.tracking import latest_training_run_id, setup_tracking


def run(config: Config, run: str = "latest", force: bool = False) -> Path:
    """Evaluate a run on the test split; returns ``reports/<run_id>``. Skips runs already evaluated."""
    started = time.perf_counter()
    ingest_dir = require_output(config, "ingest")
    test_path = ingest_dir / split_table("test")
    setup_tracking(config)
    run_id = latest_training_run_id(config) if run == "latest" else run
    out_dir = config.reports_dir / run_id
    done = all((out_dir / name).is_file() for name in (METRICS_FILE, TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE))
    if done and not force and "test_accuracy" in mlflow.get_run(run_id).data.metrics:
        print(f"evaluate: up to date, run {run_id} already evaluated ({out_dir}/{METRICS_FILE})")
        return out_dir
    classifier = load_classifier(f"runs:/{run_id}/model")
    pooling = mlflow.get_run(run_id).data.params.get("model.pooling")
    test = pd.read_parquet(test_path)
    val = pd.read_parquet(ingest_dir / split_table("val"))
    counts_path = stage_dir(config, "tokenize") / token_counts_file("test")  # for a model without its own tokenizer
    token_counts = np.load(counts_path) if counts_path.is_file() else None
    if token_counts is not None and len(token_counts) != len(test):
        token_counts = None  # tokenized from another ingestion
    max_tokens = config.tokenizer.max_sequence_length - 1
    title = f"run {run_id} ({classifier.kind}" + (f", {pooling} pooling)" if pooling else ")")
    evaluation = evaluate_model(classifier, test, val, out_dir, title, token_counts=token_counts, max_tokens=max_tokens,
                                pooling=pooling)
    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        log_evaluation(evaluation, out_dir)
    metrics = evaluation.payload["metrics"]
    print(f"evaluate: read {len(test):,} test and {len(val):,} validation reviews from {ingest_dir}/; run {run_id} "
          f"({classifier.kind}{', ' + pooling if pooling else ''}): test_accuracy {metrics['test_accuracy']:.4f}, "
          f"f1 {metrics['test_f1']:.4f}, roc_auc {metrics['test_roc_auc']:.4f}, ece {metrics['test_ece']:.4f}; "
          f"{behaviour_summary(evaluation.payload['behaviour'])}; wrote {out_dir}/ in {time.perf_counter() - started:.0f}s")
    return out_dir


def main(config: Config, args) -> None:
    run(config, run=args.run, force=args.force)
