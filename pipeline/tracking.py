"""MLflow plumbing: where runs go, what every run logs, and a per-epoch metrics callback.

The tracking URI is ``tracking.tracking_uri`` if set, else ``$MLFLOW_TRACKING_URI``, else the
embedded SQLite store ``sqlite:///mlflow.db`` in the working directory (the project root
when run from ``make``).
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import keras
import mlflow

from pipeline.artifacts import code_version
from pipeline.config import Config

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
CHAMPION_ALIAS = "champion"


def champion_uri(config: Config) -> str:
    """``models:/<registered name>@champion``: what `make register` sets and `make score` uses by default."""
    return f"models:/{config.tracking.registered_model_name}@{CHAMPION_ALIAS}"


def tracking_uri(config: Config) -> str:
    return config.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


# Warnings MLflow prints on every run that do not apply here: the logged datasets are local
# Parquet files (their source is unambiguous) and their integer columns never hold missing values.
_IGNORED_MLFLOW_WARNINGS = (
    r"The specified dataset source can be interpreted in multiple ways",
    r"Hint: Inferred schema contains integer column",
)


def setup_tracking(config: Config) -> str:
    """Point MLflow at the configured store and experiment; returns the experiment id."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for message in _IGNORED_MLFLOW_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    mlflow.set_tracking_uri(tracking_uri(config))
    return mlflow.set_experiment(config.tracking.experiment_name).experiment_id


def flat_params(config: Config) -> dict[str, Any]:
    """Every resolved config value as ``section.key`` -> value (lists as comma-joined text)."""
    params = {}
    for section, values in config.to_dict().items():
        for key, value in values.items():
            params[f"{section}.{key}"] = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return params


def standard_tags(config: Config, config_hash: str, stage: str, **extra: str) -> dict[str, str]:
    return {"pipeline_stage": stage, "pooling": config.model.pooling, "position": config.model.position,
            "config_hash": config_hash, "code_version": code_version(), **extra}


class MLflowEpochLogger(keras.callbacks.Callback):
    """Logs Keras epoch metrics plus learning rate, epoch seconds and tokens per second."""

    def __init__(self, tokens_per_epoch: int):
        super().__init__()
        self.tokens_per_epoch = tokens_per_epoch
        self._started = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._started
        metrics = {name: float(value) for name, value in (logs or {}).items()}
        # With a schedule, Keras evaluates it at the optimizer's current step.
        metrics["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        metrics["epoch_seconds"] = seconds
        metrics["tokens_per_second"] = self.tokens_per_epoch / max(seconds, 1e-9)
        mlflow.log_metrics(metrics, step=epoch)
