"""The MLflow UI: links that open on the comparison, and a local ``mlflow server`` on the tracking store.

MLflow 3.17's UI has a GenAI / model-training switch. An experiment page opened without the
``workflowType`` URL parameter follows the browser's last choice, GenAI by default (a traces
overview with "No data available"), whatever the experiment's ``mlflow.experimentKind`` tag says;
every link made here therefore carries ``workflowType=machine_learning``.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from dataclasses import dataclass

from pipeline.config import TrackingConfig
from pipeline.core.errors import PipelineError
from pipeline.runtime.local_http import free_port, local_server

WORKFLOW_QUERY = "workflowType=machine_learning"  # the model-training side of the UI, not GenAI


# --------------------------------------------------------------------------- links


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKFLOW_QUERY}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_QUERY}"


def compare_url(base: str, experiment_id: str, run_ids: list[str]) -> str:
    query = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([experiment_id])})
    return f"{base}/#/compare-runs?{query}&{WORKFLOW_QUERY}"


@dataclass(frozen=True)
class Comparison:
    """What the UI pages show: the experiment, the latest comparison's parent run and its model runs."""

    experiment_id: str
    parent_id: str | None
    parent_name: str | None
    child_ids: tuple[str, ...]


def latest_comparison(tracking: TrackingConfig) -> Comparison:
    """The experiment and its latest pooling comparison (``parent_id`` None when there is none yet)."""
    from pipeline.tracking import comparison_members, latest_champion_comparison, setup_tracking

    experiment_id = setup_tracking(tracking)
    try:
        parent = latest_champion_comparison(tracking)
        children = comparison_members(parent)
    except PipelineError:
        return Comparison(experiment_id, None, None, ())
    return Comparison(
        experiment_id, parent.info.run_id, parent.info.run_name, tuple(child.info.run_id for child in children)
    )


# --------------------------------------------------------------------------- server


def server_command(tracking_uri: str, port: int) -> list[str]:
    from pipeline.tracking import absolute_tracking_uri

    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        absolute_tracking_uri(tracking_uri),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def mlflow_server(tracking_uri: str, port: int | None = None, timeout: float = 120.0):
    """``mlflow server`` on 127.0.0.1 for the duration of a ``with`` block; yields its base URL."""
    port = port or free_port()
    return local_server(server_command(tracking_uri, port), port, "/health", "mlflow server", timeout=timeout)
