"""``make pseudo-label``: the NBSVM (or TF-IDF) teacher's probabilities for the unlabeled reviews.

Reads ``data/ingest/`` (never the test split); writes ``data/pseudo_label/`` (``pseudo_labels.parquet``, a
confidence histogram, a manifest) and one MLflow run. The work, and its files in full: ``pipeline.pseudo_labels``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.pseudo_labels import pseudo_label


def run(config: Config, force: bool = False) -> Path:
    return pseudo_label(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
