"""``make serve``: the registered champion (or any logged model) over HTTP: MLflow's scoring server under uvicorn,
behind a front that describes the model and checks requests (``app``, ``validation``).

Reads:  a model (default ``models:/<registered name>@champion``) from the tracking store.
Writes: nothing; answers ``POST /invocations`` on 127.0.0.1 until Ctrl-C. The answer is the
        pyfunc model's output, the same columns ``make score`` adds (``positive_probability``,
        ``predicted_label``, ``score_error``), one record per input row in the input's order; a request with
        ``"params": {"explain": true}`` also gets ``explanation`` (as ``make score EXPLAIN=1``). ``GET /`` describes
        the model and the limits; a request over them, without a ``text`` field or without rows gets a 4xx and one
        JSON line naming the problem.

The server runs in this environment (``mlflow models serve`` defaults to ``--env-manager virtualenv``, which would
build a new environment from PyPI on every start).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from pipeline.config import Config
from pipeline.runtime.local_http import require_free_port
from pipeline.stages.serve.command import curl_line, serve_command, serve_environment


def main(config: Config, args) -> None:
    from pipeline.model.classifiers import check_model_uri
    from pipeline.tracking import champion_uri, tracking_uri

    require_free_port(args.port, "0.0.0.0" if args.host in ("0.0.0.0", "::") else args.host, "SERVE_PORT")
    model_uri = check_model_uri(args.model or champion_uri(config.tracking))
    environment = serve_environment(tracking_uri(config.tracking), model_uri, args.max_body_bytes, args.max_rows)
    command = serve_command(args.port, args.host, args.workers)
    reach = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host  # every address: this machine's is one
    print(
        f"serve: {model_uri} from {tracking_uri(config.tracking)} at http://{args.host}:{args.port}/invocations "
        f"(Ctrl-C to stop); try:\n  {curl_line(args.port, reach)}\nand with the words behind each score:\n  "
        f"{curl_line(args.port, reach, explain=True)}\n"
        f"GET http://{reach}:{args.port}/ describes the model; a request takes at most {args.max_body_bytes:,} bytes "
        f"and {args.max_rows:,} rows"
    )
    sys.stdout.flush()
    with contextlib.suppress(KeyboardInterrupt):
        completed = subprocess.run(command, env=environment, check=False)
        if completed.returncode not in (0, -2, 130):
            raise SystemExit(completed.returncode)
