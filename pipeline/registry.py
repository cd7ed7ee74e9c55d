"""Register the best model of the latest pooling comparison and point alias ``champion`` at it.

Reads:  MLflow: the newest ``compare`` parent run (factor ``pooling``) and the model runs its
        ``model_run_ids`` tag lists.
Writes: MLflow model registry: a version of ``tracking.registered_model_name`` from the
        child with the highest ``best_val_accuracy`` (validation, never test), and the
        ``champion`` alias on it. Re-running when the alias already points there does nothing.
"""

from __future__ import annotations

import mlflow

from pipeline.compare import MEMBERS_TAG
from pipeline.config import Config
from pipeline.tracking import CHAMPION_ALIAS, champion_uri, setup_tracking

def best_child(children: list) -> "mlflow.entities.Run":
    """The run with the highest validation accuracy (ties: the earliest started)."""
    candidates = [run for run in children if "best_val_accuracy" in run.data.metrics]
    if not candidates:
        raise ValueError("the latest comparison has no finished model runs with best_val_accuracy")
    return max(candidates, key=lambda run: (run.data.metrics["best_val_accuracy"], -run.info.start_time))


def run(config: Config) -> str:
    """Register the champion; returns ``models:/<name>@champion``."""
    setup_tracking(config)
    experiment = config.tracking.experiment_name
    parents = mlflow.search_runs(experiment_names=[experiment], output_format="list", max_results=1,
                                 filter_string="tags.pipeline_stage = 'compare' and tags.factor = 'pooling'",
                                 order_by=["attributes.start_time DESC"])
    if not parents:
        raise ValueError(f"no pooling comparison in MLflow experiment {experiment!r}: run `make compare` first")
    parent = parents[0]
    parent_id = parent.info.run_id
    member_ids = [i for i in parent.data.tags.get(MEMBERS_TAG, "").split(",") if i]
    if not member_ids:
        raise ValueError(f"comparison run {parent_id} lists no model runs: it did not finish; rerun `make compare`")
    client = mlflow.tracking.MlflowClient()
    children = [client.get_run(run_id) for run_id in member_ids]
    best = best_child(children)
    name = config.tracking.registered_model_name
    uri = champion_uri(config)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION_ALIAS)
    except mlflow.exceptions.MlflowException:
        current = None
    if current is not None and current.run_id == best.info.run_id:
        print(f"register: up to date, {uri} is already version {current.version} (run {best.info.run_id})")
        return uri
    version = mlflow.register_model(f"runs:/{best.info.run_id}/model", name)
    client.set_registered_model_alias(name, CHAMPION_ALIAS, version.version)
    client.set_model_version_tag(name, version.version, "pooling", best.data.params.get("model.pooling", ""))
    client.set_model_version_tag(name, version.version, "comparison_run_id", parent_id)
    print(f"register: read {len(children)} runs of comparison {parent_id}; {uri} -> version {version.version} "
          f"(run {best.info.run_id}, {best.data.params.get('model.pooling')} pooling, "
          f"best_val_accuracy {best.data.metrics['best_val_accuracy']:.4f})")
    return uri


def main(config: Config, args) -> None:
    run(config)
