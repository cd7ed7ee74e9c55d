"""``make evaluate``: score the test and validation splits with a trained run and log ``test_`` metrics to it.

Reads:  ``data/ingest/{test,val}.parquet`` and the run's MLflow pyfunc model (its own Keras model and
        tokenizer, so the texts go through exactly the preprocessing of training; any model the
        pipeline logs works, a fused or NBSVM run too).
Writes: to the same MLflow run, ``test_*`` metrics (for more than two classes also per-class
        precision/recall/F1, macro and weighted F1, one-vs-rest ROC AUC), ``val_accuracy``, plots
        (confusion matrix, ROC, reliability diagram, accuracy by review length, attention heatmaps) and
        the 50 most confident errors; ``behaviour_*`` pass rates of the CheckList-style behaviour tests
        (``pipeline.stages.evaluate.behaviour``); locally ``reports/<run_id>/`` with ``metrics.json``, the plots,
        ``errors.csv``, ``test_predictions.parquet``, ``val_predictions.parquet``, ``behaviour.md`` and
        ``behaviour.csv`` (``pipeline.stages.evaluate.scorecard``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def run(config: Config, run: str = "latest", force: bool = False) -> Path:
    """Evaluate a run on the test split; returns ``reports/<run_id>``. Skips runs already evaluated."""
    from pipeline.stages.evaluate.scorecard import evaluate_run

    return evaluate_run(config, run=run, force=force).out_dir


def main(config: Config, args) -> None:
    run(config, run=args.run, force=args.force)
