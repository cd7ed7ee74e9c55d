"""MLflow conventions: where runs go, what every run logs, the tags that tie runs together and the queries.

The tracking URI is ``tracking.tracking_uri`` if set, else ``$MLFLOW_TRACKING_URI``, else the
embedded SQLite store ``sqlite:///mlflow.db`` in the working directory (the project root
when run from ``make``).

Tag names and values are defined here and nowhere else, and this is the only module that
writes an MLflow filter string; stages call the named queries below.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow

from pipeline.config import Config, ModelConfig, TrackingConfig
from pipeline.core.errors import MissingInputError, PipelineError
from pipeline.core.files import code_version

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
CHAMPION_ALIAS = "champion"


def model_reference(model_uri: str) -> tuple[str | None, str | None, str | None]:
    """(run id, registered name, version) behind ``model_uri``; None where it has none (a folder has neither). A
    ``models:/`` URI that names no registered version raises ``ValueError`` or ``MlflowException``."""
    if model_uri.startswith("runs:/"):
        return model_uri.removeprefix("runs:/").split("/")[0], None, None
    if not model_uri.startswith("models:/"):
        return None, None, None
    client = mlflow.tracking.MlflowClient()
    reference = model_uri.removeprefix("models:/")
    if "@" in reference:
        name, alias = reference.split("@", 1)
        version = client.get_model_version_by_alias(name, alias)
    else:
        name, number = reference.split("/", 1)
        version = client.get_model_version(name, number)
    return version.run_id, name, str(version.version)


def model_run_metric(model_uri: str, key: str) -> float | None:
    """Metric ``key`` of the run that logged the model at ``model_uri`` (:func:`model_reference`); None for a model
    folder, a URI that names no run, or a run without it."""
    try:
        run_id, _, _ = model_reference(model_uri)
        return None if run_id is None else mlflow.tracking.MlflowClient().get_run(run_id).data.metrics.get(key)
    except (ValueError, mlflow.exceptions.MlflowException):
        return None


def champion_uri(tracking: TrackingConfig) -> str:
    """``models:/<registered name>@champion``: what `make register` sets and `make score` uses by default."""
    return f"models:/{tracking.registered_model_name}@{CHAMPION_ALIAS}"


def tracking_uri(tracking: TrackingConfig) -> str:
    return tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def absolute_tracking_uri(uri: str) -> str:
    """``uri`` with a relative SQLite path made absolute, for a process started in another folder."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


# Warnings MLflow prints on every run that do not apply here: the logged datasets are local
# Parquet files (their source is unambiguous) and their integer columns never hold missing values.
_IGNORED_MLFLOW_WARNINGS = (
    r"The specified dataset source can be interpreted in multiple ways",
    r"Hint: Inferred schema contains integer column",
)


# MLflow's experiment kind: a model-training experiment, not a GenAI one (traces, judges, prompts).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # MLflow's own: the run's description (Markdown) in the UI


def setup_tracking(tracking: TrackingConfig) -> str:
    """Point MLflow at the configured store and experiment; returns the experiment id.

    The experiment is tagged as a model-training experiment. MLflow 3.17's UI decides what an
    experiment page shows from its GenAI / model-training switch (the ``workflowType`` URL
    parameter, else the browser's last choice) and reads the tag only where that switch is off;
    ``pipeline.stages.ui.links`` therefore also makes links that carry the parameter.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for message in _IGNORED_MLFLOW_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    mlflow.set_tracking_uri(tracking_uri(tracking))
    experiment = mlflow.set_experiment(tracking.experiment_name)
    if experiment.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        mlflow.tracking.MlflowClient().set_experiment_tag(
            experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
        )
    return experiment.experiment_id


def fail_runs_left_running(tracking: TrackingConfig, since: float) -> list[str]:
    """Mark FAILED the runs of the experiment still RUNNING that started at or after ``since`` (seconds since the
    epoch): what a killed command left (``pipeline.core.locks``), which the UI would otherwise show running for ever
    and nothing would ever finish. A store that does not exist yet is left alone. Returns their ids."""
    uri = tracking_uri(tracking)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        return []
    client = mlflow.tracking.MlflowClient(uri)
    experiment = client.get_experiment_by_name(tracking.experiment_name)
    if experiment is None:
        return []
    left = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"attributes.status = 'RUNNING' and attributes.start_time >= {int(since * 1000)}",
    )
    for run in left:
        client.set_tag(run.info.run_id, KILLED_TAG, "its command was killed; marked failed by the next one")
        client.set_terminated(run.info.run_id, status="FAILED")
    return [run.info.run_id for run in left]


def describe_run(run_id: str, text: str) -> None:
    """Set the run's description, shown on its page in the MLflow UI."""
    mlflow.tracking.MlflowClient().set_tag(run_id, DESCRIPTION_TAG, text)


def flat_params(config: Config) -> dict[str, Any]:
    """Every resolved config value as ``section.key`` -> value (lists as comma-joined text)."""
    params = {}
    for section, values in config.to_dict().items():
        for key, value in values.items():
            params[f"{section}.{key}"] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return params


# --------------------------------------------------------------------------- tags

STAGE_TAG = "pipeline_stage"  # which stage made a run: one of the values below
TRAIN_STAGE, COMPARE_STAGE, BASELINE_STAGE, PRETRAIN_STAGE = "train", "compare", "baseline", "pretrain"
FUSION_STAGE = "fusion"  # a fused model: a Transformer run and the NBSVM run, one pyfunc
PSEUDO_LABEL_STAGE = "pseudo_label"
PSEUDO_LABELS_FROM_TAG = "pseudo_labels_from"  # on a classifier run: the pseudo-label run its extra data came from
PRETRAINED_FROM_TAG = "pretrained_from"  # on a classifier run: the pretraining run its backbone came from
# on a run fine-tuned from a model.preset checkpoint: where it came from and its licence (its licence files are
# logged under CHECKPOINT_ARTIFACTS)
CHECKPOINT_SOURCE_TAG, CHECKPOINT_LICENCE_TAG = "checkpoint_source", "checkpoint_licence"
CHECKPOINT_ARTIFACTS = "checkpoint"
# params of a fused run: its Transformer's weight (the rest is the lexical model's), the weights tried, the runs fused
FUSION_WEIGHT_PARAM = "fusion.transformer_weight"
FUSION_WEIGHTS_TRIED_PARAM = "fusion.weights_tried"
FUSION_SHORT_WEIGHT_PARAM = "fusion.short_transformer_weight"  # a length-aware fusion's weight for short texts
FUSION_SHORT_WORDS_PARAM = "fusion.short_max_words"  # and the words up to which a text is short
FUSION_CASCADE_SHARE_PARAM = "fusion.cascade_share"  # a cascade's share of validation reviews read by the Transformer
FUSION_CASCADE_THRESHOLD_PARAM = "fusion.cascade_threshold"  # and the NBSVM confidence at or below which a text is
FUSION_CASCADE_SHARES_PARAM = "fusion.cascade_shares_tried"  # the shares it was chosen among (up to the budget)
FUSION_CASCADE_TOLERANCE_PARAM = "fusion.cascade_tolerance"  # the accuracy it may lose against the fusion of every text
FUSION_TRANSFORMER_RUN_PARAM = "fusion.transformer_run"
FUSION_LEXICAL_RUN_PARAM = "fusion.lexical_run"
COMPARE_KEY_TAG = "compare_key"  # a comparison's identity: factor, config hash, tokenizer hash
FACTOR_TAG = "factor"  # on a comparison: its design (main, position; "pooling" before)
VARIANT_TAG = "variant"  # on a comparison's child: the candidate it is a run of
KILLED_TAG = "pipeline_killed"  # on a run a killed command left running, marked failed by the next writer
MODEL_KIND_TAG = "model_kind"  # on a run with a pipeline model: transformer, nbsvm or fusion (``model_kind`` reads it)
FUSED_FROM_TAGS = ("fused_transformer_run", "fused_lexical_run")  # on a fused run: the runs it combines
CHAMPION_DESIGNS = ("main", "tuned", "pooling")  # designs whose runs `make register` chooses from ("pooling":
# stores written before the factors came from the config)
MEMBERS_TAG = "model_run_ids"  # on a comparison: its model runs, comma-separated
CANDIDATES_TAG = "model_run_candidates"  # on a comparison: JSON run id -> the candidate it is a run of
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own: shows a run under its parent in the UI
VERSION_POOLING_TAG = "pooling"  # on a registered model version: the champion's pooling
VERSION_KIND_TAG = "model_kind"  # on a registered model version: transformer, lexical or fusion
VERSION_COMPARISON_TAG = "comparison_run_id"  # on a registered model version: where it was chosen
EXPORT_ARTIFACTS = "export/saved_model"  # on a model's run: its exported TensorFlow SavedModel (make export)
VERSION_EXPORT_TAG = "saved_model"  # on a registered model version: the URI of its exported SavedModel
VALIDATED_MIN_WORDS = "validated_min_words"  # a metric of an evaluated run: the shortest text it was validated on


def standard_tags(model: ModelConfig, config_hash: str, stage: str, **extra: str) -> dict[str, str]:
    return {
        STAGE_TAG: stage,
        "pooling": model.pooling,
        "position": model.position,
        "init": model.init,
        "config_hash": config_hash,
        "code_version": code_version(),
        **extra,
    }


def comparison_tags(key: str, factor: str, variants, seeds) -> dict[str, str]:
    return {
        STAGE_TAG: COMPARE_STAGE,
        COMPARE_KEY_TAG: key,
        FACTOR_TAG: factor,
        "variants": ",".join(variants),
        "seeds": ",".join(map(str, seeds)),
    }


def tag_champion_version(name: str, version: str, run, comparison_id: str) -> None:
    client = mlflow.tracking.MlflowClient()
    client.set_model_version_tag(
        name,
        version,
        VERSION_POOLING_TAG,
        run.data.params.get("model.pooling") or run.data.params.get("fused.model.pooling", ""),
    )
    client.set_model_version_tag(name, version, VERSION_KIND_TAG, model_kind(run.data.tags))
    client.set_model_version_tag(name, version, VERSION_COMPARISON_TAG, comparison_id)


# what a candidate is chosen by on validation: a Transformer's best epoch; NBSVM's and a fusion's accuracy on
# validation rows none of their own choices (C, weight) was made on, cross-fitted (their best_val_accuracy before
# 2026-12; ``selection_accuracy`` reads both)
BEST_EPOCH_METRIC, CROSS_FITTED_METRIC = "best_val_accuracy", "val_accuracy_cross_fitted"


def selection_accuracy(metrics: Mapping[str, float]) -> float | None:
    """The validation accuracy a run's model is chosen by (see above), or None for a run without one."""
    value = metrics.get(CROSS_FITTED_METRIC, metrics.get(BEST_EPOCH_METRIC))
    return None if value is None else float(value)


# model kinds runs were tagged with before they were renamed -> today's (``model_kind`` reads them)
OLD_MODEL_KINDS = {"lexical": "nbsvm"}


def model_kind(tags: dict[str, str]) -> str:
    """What a logged run's model is (``transformer``, ``nbsvm``, ``fusion``), read from its tags, old names too."""
    kind = tags.get(MODEL_KIND_TAG, "transformer")
    return OLD_MODEL_KINDS.get(kind, kind)


def baseline_tags(key: str, variant: str) -> dict[str, str]:
    return {STAGE_TAG: BASELINE_STAGE, VARIANT_TAG: variant, COMPARE_KEY_TAG: key}


def fusion_tags(key: str, variant: str, transformer_run_id: str, lexical_run_id: str) -> dict[str, str]:
    return {
        STAGE_TAG: FUSION_STAGE,
        VARIANT_TAG: variant,
        COMPARE_KEY_TAG: key,
        FUSED_FROM_TAGS[0]: transformer_run_id,
        FUSED_FROM_TAGS[1]: lexical_run_id,
    }


def set_members(members: dict[str, str]) -> None:
    """Record on the active comparison run which model runs belong to it, and the candidate each is a run of
    (``run id -> candidate``; runs shared with another comparison keep this comparison's name here)."""
    mlflow.set_tags({MEMBERS_TAG: ",".join(members), CANDIDATES_TAG: json.dumps(members, separators=(",", ":"))})


def member_candidates(comparison) -> dict[str, str]:
    """``run id -> candidate`` of a comparison (empty for one written before it was recorded)."""
    return json.loads(comparison.data.tags.get(CANDIDATES_TAG, "{}"))


def adopt_child(run_id: str, parent_id: str) -> str:
    """Show ``run_id`` under ``parent_id`` unless it already has a parent; returns the parent it shows under.

    A run trained on its own (`make train`) joins the comparison. A run already under another
    comparison (runs shared by the pooling comparison and the position ablation) keeps its
    parent; the ``MEMBERS_TAG`` of each comparison lists all of its runs.
    """
    client = mlflow.tracking.MlflowClient()
    current = client.get_run(run_id).data.tags.get(PARENT_RUN_TAG)
    if current is None:
        client.set_tag(run_id, PARENT_RUN_TAG, parent_id)
    return current or parent_id


# --------------------------------------------------------------------------- queries


def _find_runs(tracking: TrackingConfig, tags: dict[str, str], finished: bool = False) -> list:
    """The newest run of the experiment carrying every tag in ``tags`` (a list of one, or empty)."""
    clauses = [f"tags.`{name}` = '{value}'" for name, value in tags.items()]
    if finished:
        clauses.append("attributes.status = 'FINISHED'")
    return mlflow.search_runs(
        experiment_names=[tracking.experiment_name],
        output_format="list",
        filter_string=" and ".join(clauses),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )


def latest_training_run_id(tracking: TrackingConfig) -> str:
    """The newest finished training run of the experiment."""
    runs = _find_runs(tracking, {STAGE_TAG: TRAIN_STAGE}, finished=True)
    if not runs:
        raise PipelineError(
            f"no finished training run in MLflow experiment {tracking.experiment_name!r}: "
            "run `make train` first (or pass --run RUN_ID)"
        )
    return runs[0].info.run_id


def find_comparison_run_id(tracking: TrackingConfig, key: str) -> str | None:
    """The comparison run with this key, to resume or extend; None when there is none yet."""
    runs = _find_runs(tracking, {STAGE_TAG: COMPARE_STAGE, COMPARE_KEY_TAG: key})
    return runs[0].info.run_id if runs else None


def find_baseline_run(tracking: TrackingConfig, key: str, variant: str):
    """The finished baseline child (``variant``: nbsvm, tfidf) of the comparison with this key, or None."""
    runs = _find_runs(tracking, {STAGE_TAG: BASELINE_STAGE, COMPARE_KEY_TAG: key, VARIANT_TAG: variant}, finished=True)
    return runs[0] if runs else None


def find_fusion_run(tracking: TrackingConfig, key: str, transformer_run_id: str, lexical_run_id: str):
    """The finished fused run of these two runs in the comparison with this key, or None."""
    runs = _find_runs(
        tracking,
        {
            STAGE_TAG: FUSION_STAGE,
            COMPARE_KEY_TAG: key,
            FUSED_FROM_TAGS[0]: transformer_run_id,
            FUSED_FROM_TAGS[1]: lexical_run_id,
        },
        finished=True,
    )
    return runs[0] if runs else None


def latest_champion_comparison(tracking: TrackingConfig):
    """The comparison that finished last among those whose model runs are candidates for `make register`
    (``CHAMPION_DESIGNS``): a rerun comparison continues its old run, so its start time says nothing."""
    runs = [
        run
        for name in CHAMPION_DESIGNS
        for run in _find_runs(tracking, {STAGE_TAG: COMPARE_STAGE, FACTOR_TAG: name}, finished=True)
    ]
    runs.sort(key=lambda run: run.info.end_time or run.info.start_time, reverse=True)
    if not runs:
        raise PipelineError(
            f"no finished comparison in MLflow experiment {tracking.experiment_name!r}: "
            "run `make compare` first (finished runs are reused)"
        )
    return runs[0]


def comparison_members(comparison) -> list:
    """The model runs a comparison lists in ``MEMBERS_TAG``."""
    member_ids = [i for i in comparison.data.tags.get(MEMBERS_TAG, "").split(",") if i]
    if not member_ids:
        raise PipelineError(
            f"comparison run {comparison.info.run_id} lists no model runs: it did not finish; rerun `make compare`"
        )
    client = mlflow.tracking.MlflowClient()
    return [client.get_run(run_id) for run_id in member_ids]


def child_runs(tracking: TrackingConfig, parent_id: str) -> list:
    """The runs shown under ``parent_id`` (a comparison's children); an error when the experiment does not exist."""
    client = mlflow.tracking.MlflowClient()
    experiment = client.get_experiment_by_name(tracking.experiment_name)
    if experiment is None:
        raise MissingInputError(
            f"no MLflow experiment {tracking.experiment_name!r} (tracking.experiment_name): run the comparison"
        )
    return list(
        client.search_runs([experiment.experiment_id], filter_string=f"tags.`{PARENT_RUN_TAG}` = '{parent_id}'")
    )


def metric_history(run_id: str, key: str) -> list[float]:
    """The values of metric ``key`` of a run in step order, the last one logged at each step (a resumed fit logs an
    epoch again)."""
    points = sorted(mlflow.tracking.MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)
    by_step = {m.step: m.value for m in points}
    return [by_step[step] for step in sorted(by_step)]
