"""Which run becomes ``@champion``: the candidate ``pipeline.metrics.champion_choice`` picks on validation (never
test): within ``compare.champion_tolerance`` of the best validation accuracy, the best on the validation sentence
crops; and its registration with its model card."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np

from pipeline.config import Config
from pipeline.core.errors import InputError, PipelineError
from pipeline.core.logs import printed_to_log
from pipeline.metrics import champion_choice
from pipeline.stages.register.card import write_model_card
from pipeline.tracking import (
    CHAMPION_ALIAS,
    VARIANT_TAG,
    VERSION_COMPARISON_TAG,
    champion_uri,
    comparison_members,
    latest_champion_comparison,
    member_candidates,
    selection_accuracy,
    setup_tracking,
    tag_champion_version,
)


def best_run(runs: list, candidates: dict[str, str] | None = None, tolerance: float = 0.0) -> mlflow.entities.Run:
    """The champion: the candidate ``metrics.champion_choice`` picks from its runs' (its seeds') mean validation
    accuracy and mean validation sentence-crop accuracy (within ``tolerance`` of the best validation accuracy, the
    best on the crops), and of its runs the one with the highest validation accuracy (ties: the earliest started).
    A candidate is what the comparison recorded for the run (``candidates``: run id -> name), else the run's
    ``variant`` tag (a Transformer variant, ``nbsvm``, a fused variant); runs without either stand alone. Test
    accuracy is never read."""
    candidates = candidates or {}
    scored = [run for run in runs if selection_accuracy(run.data.metrics) is not None]
    if not scored:
        raise PipelineError("the latest comparison has no finished model runs with a validation accuracy")
    groups: dict[str, list] = {}
    for run in scored:
        name = candidates.get(run.info.run_id) or run.data.tags.get(VARIANT_TAG) or run.info.run_id
        groups.setdefault(name, []).append(run)
    # in start order, so that ties go to the candidate that started first
    groups = dict(sorted(groups.items(), key=lambda item: min(r.info.start_time for r in item[1])))

    def mean(group: list, read) -> float:
        return float(np.mean([read(r.data.metrics) for r in group]))

    best_group = champion_choice(
        {name: mean(group, selection_accuracy) for name, group in groups.items()},
        {
            name: mean(group, lambda metrics: metrics["val_crop_accuracy"])
            for name, group in groups.items()
            if all("val_crop_accuracy" in r.data.metrics for r in group)
        },
        tolerance,
    )
    return max(groups[best_group], key=lambda run: (selection_accuracy(run.data.metrics), -run.info.start_time))


def register_champion(config: Config, force: bool = False) -> str:
    """Register the champion; returns ``models:/<name>@champion``."""
    setup_tracking(config.tracking)
    comparison = latest_champion_comparison(config.tracking)
    members = comparison_members(comparison)
    best = best_run(members, member_candidates(comparison), config.compare.champion_tolerance)
    client = mlflow.tracking.MlflowClient()
    name = config.tracking.registered_model_name
    uri = champion_uri(config.tracking)
    try:
        current = client.get_model_version_by_alias(name, CHAMPION_ALIAS)
    except mlflow.exceptions.MlflowException:
        current = None
    if not force and current is not None and current.run_id == best.info.run_id:
        card = write_model_card(config.reports_dir, name, current.version, best, len(members), comparison.info.run_id)
        print(
            f"register: up to date, {uri} is already version {current.version} (run {best.info.run_id}); "
            f"refreshed its model card {card}"
        )
        return uri
    with printed_to_log():  # MLflow prints its "Successfully registered" and "Created version" notices
        version = mlflow.register_model(f"runs:/{best.info.run_id}/model", name)
    client.set_registered_model_alias(name, CHAMPION_ALIAS, version.version)
    tag_champion_version(name, version.version, best, comparison.info.run_id)
    card = write_model_card(config.reports_dir, name, version.version, best, len(members), comparison.info.run_id)
    print(
        f"register: read {len(members)} runs of comparison {comparison.info.run_id}; {uri} -> version "
        f"{version.version} (run {best.info.run_id}, {best.data.tags.get(VARIANT_TAG, 'transformer')}, "
        f"validation accuracy {selection_accuracy(best.data.metrics):.4f}, "
        f"val_crop_accuracy {best.data.metrics.get('val_crop_accuracy', float('nan')):.4f}); "
        f"wrote its model card {card}"
    )
    return uri


def refresh_model_card(reports_dir: Path, name: str, version: str) -> Path:
    """Write a registered version's model card again (after ``make export`` tagged it), from the comparison it was
    chosen in."""
    client = mlflow.tracking.MlflowClient()
    model_version = client.get_model_version(name, version)
    comparison_id = model_version.tags.get(VERSION_COMPARISON_TAG, "")
    candidates = len(comparison_members(client.get_run(comparison_id))) if comparison_id else 0
    if model_version.run_id is None:
        raise InputError(f"registered model {name} version {version} names no MLflow run to write its card from")
    return write_model_card(reports_dir, name, version, client.get_run(model_version.run_id), candidates, comparison_id)
