"""``make compare``: every candidate for ``@champion`` trained, evaluated and compared by one protocol.

Reads:  ``data/tokenize/`` and ``data/ingest/`` (``data/pretrain/`` and ``data/pseudo_label/`` when a
        variant needs them: they are made first).
Writes: one MLflow parent run with a child per candidate (each Transformer variant and seed of the config's
        ``compare`` section, NBSVM, one fused model per Transformer run, the TF-IDF reference) and
        ``reports/comparison.{md,json,png}``. The protocol: ``pipeline.comparison.runner``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.comparison.runner import run_comparison
from pipeline.config import Config


def run(config: Config, design: str = "main", force: bool = False) -> Path:
    """The comparison the config's compare section declares (``design`` ``position`` or ``tuned``: the
    experiments ``ablate-position`` and ``compare-tuned``); returns the Markdown report."""
    return run_comparison(config, design, force=force)


def main(config: Config, args) -> None:
    run(config, design=args.design, force=args.force)
