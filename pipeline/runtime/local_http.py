"""Local HTTP servers the pipeline starts for a while: the MLflow UI and the model server.

Each runs as a child process on 127.0.0.1 in a temporary folder (its log there), is ready when a
probe URL answers, and is stopped when the block ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from pipeline.core.errors import PipelineError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_free_port(port: int, host: str, variable: str) -> None:
    """An ``error:`` line naming the make variable to change when ``port`` on ``host`` is taken (another server, an
    earlier `make ui` or `make serve` still running)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise PipelineError(
                f"port {port} on {host} is in use (another server, or an earlier `make ui`/`make serve` still "
                f"running): stop it or pick another port with {variable}=..."
            ) from None


@contextlib.contextmanager
def local_server(
    command: Sequence[str],
    port: int,
    probe: str,
    what: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> Iterator[str]:
    """Run ``command`` (serving on ``port``) for the block; yields ``http://127.0.0.1:<port>`` once
    ``probe`` answers. A server that exits or stays silent for ``timeout`` seconds is an error
    quoting the end of its log."""
    with tempfile.TemporaryDirectory(prefix="pipeline-server-") as folder:
        log_path = Path(folder) / "server.log"
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env=dict(env) if env is not None else None,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    urllib.request.urlopen(f"{base}{probe}", timeout=2)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        tail = log_path.read_text(errors="replace")[-2000:]
                        raise PipelineError(f"{what} on {base} did not start: {tail}") from None
                    time.sleep(0.5)
            yield base
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
