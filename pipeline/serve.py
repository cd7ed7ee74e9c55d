"""Serving stage: the registered champion (or any logged model) over HTTP with ``mlflow models serve``.

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

from pipeline.config import Config

EXAMPLE_REQUEST = {"dataframe_records": [{"text": "A moving story, wonderfully acted."},
                                         {"text": "Dull, and far too long."}]}


def serve_command(model_uri: str, port: int, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
            "--host", host, "--port", str(port)]


def curl_line(port: int, host: str = "127.0.0.1") -> str:
    return (f"curl -s http://{host}:{port}/invocations -H 'Content-Type: application/json' "
            f"-d '{json.dumps(EXAMPLE_REQUEST)}'")


def main(config: Config, args) -> None:
    from pipeline.tracking import champion_uri, tracking_uri

    model_uri = args.model or champion_uri(config)
    environment = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri(config), "MLFLOW_DISABLE_TELEMETRY": "true"}
    print(f"serve: {model_uri} from {tracking_uri(config)} at http://127.0.0.1:{args.port}/invocations "
          f"(Ctrl-C to stop); try:\n  {curl_line(args.port)}")
    sys.stdout.flush()
    with contextlib.suppress(KeyboardInterrupt):
        completed = subprocess.run(serve_command(model_uri, args.port), env=environment, check=False)
        if completed.returncode not in (0, -2, 130):
            raise SystemExit(completed.returncode)
