"""``make ablate-position``: learned positions against none, everything else as configured (an ablation).

Reads:  ``data/tokenize/``, ``data/ingest/``.
Writes: a comparison whose runs are not candidates for ``make register`` (shared with ``make compare``
        where the settings agree) and ``reports/ablation_position.{md,json,png}``. The design:
        ``position`` in ``pipeline/stages/compare/designs.yaml``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.stages.compare.runner import run_comparison

DESIGN = "position"


def run(config: Config, force: bool = False) -> Path:
    return run_comparison(config, DESIGN, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
