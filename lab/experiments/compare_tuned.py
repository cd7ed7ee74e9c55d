"""``make compare-tuned``: the config ``make tune`` found best against the configured one, in one comparison.

Reads:  ``compare.tuned`` (default ``reports/tune/best.yaml``), ``data/tokenize/``, ``data/ingest/``.
Writes: a comparison (MLflow parent run and children, with NBSVM and the fused candidates, which
        ``make register`` chooses from) and ``reports/comparison_tuned.{md,json,png}``. The design:
        ``tuned`` in ``pipeline/stages/compare/designs.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.stages.compare.runner import run_comparison

DESIGN = "tuned"


def run(config: Config, force: bool = False) -> Path:
    return run_comparison(config, DESIGN, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
