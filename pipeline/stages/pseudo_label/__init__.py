"""``make pseudo-label``: the NBSVM (or TF-IDF) teacher's probabilities for the unlabeled reviews.

Reads ``data/ingest/`` (never the test split); writes ``data/pseudo_label/`` (``pseudo_labels.parquet``, a
confidence histogram, a manifest) and one MLflow run. The work, and its files in full:
``pipeline.stages.pseudo_label.teacher``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def run(config: Config, force: bool = False) -> Path:
    from pipeline.stages.pseudo_label.teacher import pseudo_label

    return pseudo_label(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
