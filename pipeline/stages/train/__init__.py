"""``make train``: the Transformer classifier on tokenized reviews, tracked in MLflow.

Reads:  ``data/tokenize/`` (ids, labels, vocabulary, manifest), ``data/ingest/`` (logged as the run's
        datasets); with ``training.pseudo_labels`` ``data/pseudo_label/`` (the pseudo-label stage runs first, and
        says so), with ``model.init: pretrained`` ``data/pretrain/``.
Writes: ``data/train/<run folder>/`` with ``model.keras``, the tokenizer files, ``model_settings.json`` (how the
        model reads a long review), ``history.json``, ``training_curves.png`` and ``manifest.json``; one MLflow run
        with its params, per-epoch metrics, plots and a pyfunc model scoring raw strings (``fit_and_log``).
        Its readers for the stages downstream: ``outputs``.
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
