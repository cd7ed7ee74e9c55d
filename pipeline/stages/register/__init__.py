"""``make register``: the best model of the latest comparison, alias ``champion`` pointed at it.

Reads:  MLflow: the newest comparison whose runs are deployment candidates (the pooling
        comparison; ablations are not) and the model runs it lists.
Writes: MLflow model registry: a version of ``tracking.registered_model_name`` from the
        run with the highest validation accuracy (``pipeline.tracking.selection_accuracy``; never test), and the
        ``champion`` alias on it, with a model card as the version's description (also
        ``reports/<run_id>/model_card.md``): data, splits, test metrics with bootstrap confidence
        intervals, calibration, behaviour-test pass rates, limits and intended use, all read from
        the run's own parameters, metrics and evaluation artifacts. Re-running when the alias
        already points there registers nothing (the card is refreshed); ``--force`` registers a
        new version anyway.
"""

from __future__ import annotations

from pipeline.config import Config


def run(config: Config, force: bool = False) -> str:
    """Register the champion (``pipeline.stages.register.champion``); returns ``models:/<name>@champion``."""
    from pipeline.stages.register.champion import register_champion

    return register_champion(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
