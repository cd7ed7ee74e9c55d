"""Register the best model of the latest comparison and point alias ``champion`` at it.

Reads:  MLflow: the newest comparison whose runs are deployment candidates (the pooling
        comparison; ablations are not) and the model runs it lists.
Writes: MLflow model registry: a version of ``tracking.registered_model_name`` from the
        run with the highest ``best_val_accuracy`` (validation, never test), and the
        ``champion`` alias on it. Re-running when the alias already points there does
        nothing; ``--force`` registers a new version anyway.
"""

from __future__ import annotations

import mlflow

from pipeline.config import Config
from pipeline.errors import PipelineError
from pipeline.tracking import (
    CHAMPION_ALIAS,
    champion_uri,
    comparison_members,
    latest_champion_comparison,
    setup_tracking,
    tag_champion_version,
)


def best_run(runs: list) -> "mlflow.entities.Run":
    """The run with the highest validation accuracy (ties: the earliest started)."""
    candidates = [run for run in runs if "best_val_accuracy" in run.data.metrics]
    if not candidates:
        raise PipelineError("the latest comparison has no finished model runs with best_val_accuracy")
    return max(candidates, key=lambda run: (run.data.metrics["best_val_accuracy"], -run.info.start_time))


def run(config: Config, force: bool = False) -> str:
    """Register the champion; returns ``models:/<name>@champion``."""
    setup_tracking(config)
    comparison = latest_champion_comparison(config)
    members = comparison_members(comparison)
    best = best_run(members)
    client = mlflow.tracking.MlflowClient()
    name = config.tracking.registered_model_name
    uri = champion_uri(config)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION_ALIAS)
    except mlflow.exceptions.MlflowException:
        current = None
    if not force and current is not None and current.run_id == best.info.run_id:
        print(f"register: up to date, {uri} is already version {current.version} (run {best.info.run_id})")
        return uri
    version = mlflow.register_model(f"runs:/{best.info.run_id}/model", name)
    client.set_registered_model_alias(name, CHAMPION_ALIAS, version.version)
    tag_champion_version(name, version.version, best, comparison.info.run_id)
    print(f"register: read {len(members)} runs of comparison {comparison.info.run_id}; {uri} -> version "
          f"{version.version} (run {best.info.run_id}, {best.data.params.get('model.pooling')} pooling, "
          f"best_val_accuracy {best.data.metrics['best_val_accuracy']:.4f})")
    return uri


def main(config: Config, args) -> None:
    run(config, force=args.force)
