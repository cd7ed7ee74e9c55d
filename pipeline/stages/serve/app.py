"""The web app ``make serve`` runs under uvicorn: MLflow's scoring server behind a front that states what it takes.

Reads:  the model URI and the request limits from the environment (``command.MODEL_ENV``, ``MAX_BODY_ENV``,
        ``MAX_ROWS_ENV``; uvicorn imports an app by name and passes no arguments), the model from the tracking store.
Writes: nothing; answers HTTP.

The scoring server is MLflow's own (``mlflow.pyfunc.scoring_server.init``, the FastAPI app ``mlflow models serve``
starts), unchanged: ``POST /invocations``, ``GET /ping``, ``/health`` and ``/version`` answer as there, and a request
running past ``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT`` seconds (60) gets its 504. In front of it (a plain ASGI
wrapper, so nothing depends on how MLflow builds its app):

- ``GET /`` describes the model: its URI, labels, answer columns, how to ask and the limits;
- ``POST /invocations`` is checked before MLflow parses it (:mod:`pipeline.stages.serve.validation`): a body over the
  byte limit (by its ``Content-Length`` or once the stream passes it) or with too many rows is answered 413, one with
  no rows, no ``text`` field, bad JSON or bad UTF-8 400, another content type 415, each with one JSON line
  ``{"error_code": ..., "message": ...}`` naming the field or row.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from pipeline.stages.serve.command import EXAMPLE_REQUEST, MAX_BODY_ENV, MAX_ROWS_ENV, MODEL_ENV
from pipeline.stages.serve.validation import (
    CONTENT_TYPES,
    RequestLimits,
    RequestProblem,
    body_too_large,
    check_request,
)

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


def create_app() -> App:
    """uvicorn's factory (``--factory``; each worker calls it once): the model named by the environment, loaded,
    behind the front."""
    from mlflow.environment_variables import MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT
    from mlflow.pyfunc import scoring_server

    from pipeline.model.classifiers import load_pyfunc_model, output_columns

    model_uri = os.environ[MODEL_ENV]
    limits = limits_from_environment(os.environ)
    model = load_pyfunc_model(model_uri)
    labels = list(model.unwrap_python_model().labels)
    page = description(model_uri, labels, output_columns(labels), limits, MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.get())
    return ServingFront(scoring_server.init(model), page, limits)


def limits_from_environment(environment: Mapping[str, str]) -> RequestLimits:
    defaults = RequestLimits()
    return RequestLimits(
        max_body_bytes=int(environment.get(MAX_BODY_ENV, defaults.max_body_bytes)),
        max_rows=int(environment.get(MAX_ROWS_ENV, defaults.max_rows)),
    )


def description(
    model_uri: str, labels: list[str], columns: list[str], limits: RequestLimits, timeout_seconds: int
) -> dict[str, Any]:
    """What ``GET /`` answers: the model, how to ask it and what it takes."""
    return {
        "model": model_uri,
        "labels": labels,
        "ask": "POST /invocations with Content-Type: application/json and a body such as the example; CSV or Parquet "
        "with a 'text' column work too",
        "example": EXAMPLE_REQUEST,
        "answer": f"{{'predictions': [...]}}, one per row in order, with {columns}; a row that cannot be scored has "
        'its reason in score_error; "params": {"explain": true} adds \'explanation\'',
        "limits": {
            "max_body_bytes": limits.max_body_bytes,
            "max_rows": limits.max_rows,
            "timeout_seconds": timeout_seconds,
            "content_types": list(CONTENT_TYPES),
        },
        "errors": 'a refused request gets 400, 413 or 415 and one JSON line {"error_code": ..., "message": ...}',
        "endpoints": {
            "POST /invocations": "score",
            "GET /ping": "200 once the model is loaded",
            "GET /health": "as /ping",
            "GET /version": "MLflow's version",
        },
    }


class ServingFront:
    """An ASGI app: ``GET /`` from ``page``, ``POST /invocations`` checked against ``limits`` then handed to
    ``scoring_app`` with its body, everything else handed on as it came."""

    def __init__(self, scoring_app: App, page: dict[str, Any], limits: RequestLimits) -> None:
        self.scoring_app, self.limits = scoring_app, limits
        self.page = json.dumps(page, indent=2).encode() + b"\n"

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/" and scope["method"] in ("GET", "HEAD"):
            await respond(send, 200, self.page, head=scope["method"] == "HEAD")
            return
        if scope["type"] == "http" and scope["path"] == "/invocations" and scope["method"] == "POST":
            try:
                body = await read_body(scope, receive, self.limits)
                if body is None:  # the client went away
                    return
                # parsing megabytes of JSON takes tens of milliseconds: off the event loop, as MLflow scores
                await asyncio.to_thread(check_request, header(scope, b"content-type"), body, self.limits)
            except RequestProblem as problem:
                await respond(send, problem.status, problem.body())
                return
            receive = replay(body, receive)
        await self.scoring_app(scope, receive, send)


def header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def read_body(scope: Mapping[str, Any], receive: Receive, limits: RequestLimits) -> bytes | None:
    """The request's body, or None when the client disconnects first; :class:`RequestProblem` (413) as soon as its
    ``Content-Length`` or the bytes received pass ``limits.max_body_bytes`` (the rest is never read)."""
    declared = (header(scope, b"content-length") or "").strip()
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise body_too_large(limits, int(declared))
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise body_too_large(limits)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, as one message, then waits on the client as ``receive`` does."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


async def respond(send: Send, status: int, body: bytes, head: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})
