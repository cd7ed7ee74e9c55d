"""``make serve``: the registered champion (or any logged model) over HTTP with ``mlflow models serve``.

Reads:  a model (default ``models:/<registered name>@champion``) from the tracking store.
Writes: nothing; answers ``POST /invocations`` on 127.0.0.1 until Ctrl-C. The answer is the
        pyfunc model's output, the same columns ``make score`` adds (``positive_probability``,
        ``predicted_label``, ``score_error``), one record per input row in the input's order.

``--env-manager local`` serves from this environment (the default, ``virtualenv``, would build a
new environment from PyPI on every start).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from pipeline.config import Config
from pipeline.runtime.local_http import free_port, local_server

EXAMPLE_REQUEST = {"dataframe_records": [{"text": "A moving story, wonderfully acted."},
                                         {"text": "Dull, and far too long."}]}


def serve_environment(tracking_uri: str) -> dict[str, str]:
    """The server's environment: the tracking store, and this interpreter's bin folder first on PATH
    (MLflow starts ``uvicorn`` by name, which is only found when the virtual environment is active)."""
    from pipeline.tracking import absolute_tracking_uri

    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "MLFLOW_TRACKING_URI": absolute_tracking_uri(tracking_uri),
            "MLFLOW_DISABLE_TELEMETRY": "true"}


def serve_command(model_uri: str, port: int, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
            "--host", host, "--port", str(port)]


def curl_line(port: int, host: str = "127.0.0.1") -> str:
    return (f"curl -s http://{host}:{port}/invocations -H 'Content-Type: application/json' "
            f"-d '{json.dumps(EXAMPLE_REQUEST)}'")


def model_server(model_uri: str, tracking_uri: str, port: int | None = None, timeout: float = 240.0):
    """``mlflow models serve`` of ``model_uri`` on 127.0.0.1 for a ``with`` block; yields its base URL once it answers."""
    port = port or free_port()
    return local_server(serve_command(model_uri, port), port, "/ping", f"mlflow models serve of {model_uri}",
                        env=serve_environment(tracking_uri), timeout=timeout)


def invoke(base: str, records: list[dict]) -> list[dict]:
    """POST ``records`` to ``/invocations``; the model's answer, one dict per record."""
    body = json.dumps({"dataframe_records": records}).encode()
    request = urllib.request.Request(f"{base}/invocations", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["predictions"]


def main(config: Config, args) -> None:
    from pipeline.model.classifiers import check_model_uri
    from pipeline.tracking import champion_uri, tracking_uri

    model_uri = check_model_uri(args.model or champion_uri(config.tracking))
    environment = serve_environment(tracking_uri(config.tracking))
    print(f"serve: {model_uri} from {tracking_uri(config.tracking)} at http://127.0.0.1:{args.port}/invocations "
          f"(Ctrl-C to stop); try:\n  {curl_line(args.port)}")
    sys.stdout.flush()
    with contextlib.suppress(KeyboardInterrupt):
        completed = subprocess.run(serve_command(model_uri, args.port), env=environment, check=False)
        if completed.returncode not in (0, -2, 130):
            raise SystemExit(completed.returncode)
