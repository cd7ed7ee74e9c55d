"""``make compare``: every candidate for ``@champion`` trained, evaluated and compared by one protocol.

Reads:  ``data/tokenize/`` and ``data/ingest/`` (``data/pretrain/`` and ``data/pseudo_label/`` when a
        variant needs them: they are made first).
Writes: one MLflow parent run with a child per candidate (each Transformer variant and seed of the config's
        ``compare`` section, NBSVM, one fused model per Transformer run, the TF-IDF reference) and
        ``reports/comparison.{md,json,png}``.

Its parts:
- ``designs``: what a comparison varies (the compare section's factors; ``designs.yaml`` for the experiments);
- ``candidates``: ``Candidate``, and one producer per kind (Transformer variant and seed, NBSVM, fusion, TF-IDF);
- ``effects``: summaries, factor effects and the recommendation, from candidates (statistics: ``pipeline.metrics``);
- ``report``: the verdict, the Markdown/JSON report, the plot, the MLflow descriptions;
- ``runner``: ``run_comparison``, the loop that asks for candidates and hands them on (``make compare`` and the
  ``compare-tuned`` and ``ablate-position`` experiments call it).

Importing this package imports nothing heavy; the modules are imported when the stage runs.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def run(config: Config, design: str = "main", force: bool = False) -> Path:
    """The comparison the config's compare section declares (``design`` ``position`` or ``tuned``: the
    experiments ``ablate-position`` and ``compare-tuned``); returns the Markdown report."""
    from pipeline.stages.compare.runner import run_comparison

    return run_comparison(config, design, force=force)


def main(config: Config, args) -> None:
    run(config, design=args.design, force=args.force)
