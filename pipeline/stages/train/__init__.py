"""``make train``: the Transformer classifier on tokenized reviews, tracked in MLflow.

Reads:  ``data/tokenize/`` (ids, labels, vocabulary, manifest), ``data/ingest/`` (logged as the run's
        datasets) and, with ``training.pseudo_labels``, ``data/pseudo_label/``.
Writes: ``data/train/<run folder>/`` with ``model.keras``, the tokenizer files, ``history.json``,
        ``training_curves.png`` and ``manifest.json``; one MLflow run with its params, per-epoch
        metrics, plots and a pyfunc model scoring raw strings (``pipeline.stages.train.fit_and_log``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def run(config: Config, force: bool = False) -> Path:
    """Train one model; returns its run folder (``data/train/<run folder>/``)."""
    from pipeline.stages.train.fit_and_log import train_model
    return train_model(config, force=force).run_dir


def main(config: Config, args) -> None:
    run(config, force=args.force)
