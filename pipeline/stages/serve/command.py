"""The command ``make serve`` runs (uvicorn with :mod:`pipeline.stages.serve.app`: MLflow's scoring server, as
``mlflow models serve`` starts it, behind a front that checks requests), its environment, and the request a user
can try.

Pure: builds the command line, the environment and the example ``curl``; the stage's entry point runs them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipeline.core.errors import ConfigError
from pipeline.stages.serve.validation import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_ROWS, RequestLimits

# how the command hands the app what uvicorn cannot pass it as arguments (MLflow's app reads its model path the same
# way): the model URI, and the request limits (pipeline.stages.serve.validation.RequestLimits)
MODEL_ENV, MAX_BODY_ENV, MAX_ROWS_ENV = (
    "PIPELINE_SERVE_MODEL",
    "PIPELINE_SERVE_MAX_BODY_BYTES",
    "PIPELINE_SERVE_MAX_ROWS",
)
APP_FACTORY = "pipeline.stages.serve.app:create_app"

EXAMPLE_REQUEST = {
    "dataframe_records": [{"text": "A moving story, wonderfully acted."}, {"text": "Dull, and far too long."}]
}


def serve_environment(
    tracking_uri: str, model_uri: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_rows: int = DEFAULT_MAX_ROWS
) -> dict[str, str]:
    """The server's environment: the tracking store, the model and the request limits, and this interpreter's bin
    folder first on PATH (as a shell with the virtual environment active has it)."""
    from pipeline.tracking import absolute_tracking_uri

    RequestLimits(max_body_bytes, max_rows)  # a bad limit is an error here, not a server that never starts
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {
        **os.environ,
        "PATH": path,
        "MLFLOW_TRACKING_URI": absolute_tracking_uri(tracking_uri),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        MODEL_ENV: model_uri,
        MAX_BODY_ENV: str(max_body_bytes),
        MAX_ROWS_ENV: str(max_rows),
    }


def serve_command(port: int, host: str = "127.0.0.1", workers: int = 1) -> list[str]:
    """uvicorn serving the app on ``host:port``; ``workers`` processes each load the model and share the port."""
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be a whole number of at least 1, not {workers!r}")
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        APP_FACTORY,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def curl_line(port: int, host: str = "127.0.0.1", explain: bool = False) -> str:
    """The example request; with ``explain``, asking for the ``explanation`` column too (the model's request option
    ``explain``, and ``explain_top`` for how many words)."""
    request = {**EXAMPLE_REQUEST, "params": {"explain": True}} if explain else EXAMPLE_REQUEST
    return f"curl -s http://{host}:{port}/invocations -H 'Content-Type: application/json' -d '{json.dumps(request)}'"
