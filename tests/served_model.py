"""A model served by ``make serve``'s command for a ``with`` block, and a request to it: what the serving tests
share (the stage itself runs the server in the foreground until Ctrl-C)."""

import json
import urllib.request

from pipeline.runtime.local_http import free_port, local_server
from pipeline.stages.serve.command import serve_command, serve_environment


def model_server(
    model_uri: str,
    tracking_uri: str,
    port: int | None = None,
    timeout: float = 240.0,
    workers: int = 1,
    **limits: int,
):
    """``make serve``'s server of ``model_uri`` on 127.0.0.1 for a ``with`` block (``limits``: ``max_body_bytes``,
    ``max_rows``); yields its base URL once it answers."""
    port = port or free_port()
    return local_server(
        serve_command(port, workers=workers),
        port,
        "/ping",
        f"make serve's server of {model_uri}",
        env=serve_environment(tracking_uri, model_uri, **limits),
        timeout=timeout,
    )


def invoke(base: str, records: list[dict], params: dict | None = None) -> list[dict]:
    """POST ``records`` (and the request options ``params``) to ``/invocations``; the model's answer, one dict per
    record."""
    body = json.dumps({"dataframe_records": records, **({"params": params} if params else {})}).encode()
    request = urllib.request.Request(f"{base}/invocations", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["predictions"]
