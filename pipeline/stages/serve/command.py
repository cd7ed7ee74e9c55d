"""The ``mlflow models serve`` command ``make serve`` runs, its environment, and the request a user can try.

Pure: builds the command line, the environment and the example ``curl``; the stage's entry point runs them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

EXAMPLE_REQUEST = {
    "dataframe_records": [{"text": "A moving story, wonderfully acted."}, {"text": "Dull, and far too long."}]
}


def serve_environment(tracking_uri: str) -> dict[str, str]:
    """The server's environment: the tracking store, and this interpreter's bin folder first on PATH
    (MLflow starts ``uvicorn`` by name, which is only found when the virtual environment is active)."""
    from pipeline.tracking import absolute_tracking_uri

    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {
        **os.environ,
        "PATH": path,
        "MLFLOW_TRACKING_URI": absolute_tracking_uri(tracking_uri),
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


def serve_command(model_uri: str, port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlflow",
        "models",
        "serve",
        "-m",
        model_uri,
        "--env-manager",
        "local",
        "--host",
        host,
        "--port",
        str(port),
    ]


def curl_line(port: int, host: str = "127.0.0.1", explain: bool = False) -> str:
    """The example request; with ``explain``, asking for the ``explanation`` column too (the model's request option
    ``explain``, and ``explain_top`` for how many words)."""
    request = {**EXAMPLE_REQUEST, "params": {"explain": True}} if explain else EXAMPLE_REQUEST
    return f"curl -s http://{host}:{port}/invocations -H 'Content-Type: application/json' -d '{json.dumps(request)}'"
