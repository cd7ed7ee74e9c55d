"""``make bench``'s served model: `make serve`'s server under concurrent clients, and its answers to bad requests.

For each number of uvicorn workers and of concurrent clients (each a thread with its own keep-alive connection), for a
fixed time, single rows and batches: requests/s, rows/s, p50 / p99 latency, errors, and the server's peak resident
memory (the whole process tree, sampled). Then each bad request once, with its status and message, and whether the
next good request was answered.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Sequence

import numpy as np
import psutil

from pipeline.config import TrackingConfig
from pipeline.runtime.local_http import free_port, local_server
from pipeline.stages.serve.command import serve_command, serve_environment

CLIENTS = (1, 4, 16, 64)
BATCHES = (1, 100)
BAD_REQUESTS: dict[str, tuple[str, bytes]] = {  # name -> (content type, body)
    "malformed JSON": ("application/json", b'{"dataframe_records": [{"text": "good"}'),
    "no text field": ("application/json", b'{"dataframe_records": [{"review": "good"}]}'),
    "a number as text": ("application/json", b'{"dataframe_records": [{"text": 42}]}'),
    "null text": ("application/json", b'{"dataframe_records": [{"text": null}]}'),
    "invalid UTF-8": ("application/json", b'{"dataframe_records": [{"text": "\xff\xfe"}]}'),
    "an empty list": ("application/json", b'{"dataframe_records": []}'),
    "a 10 MB review": ("application/json", json.dumps({"dataframe_records": [{"text": "good " * 2_000_000}]}).encode()),
    "10,000 rows": ("application/json", json.dumps({"dataframe_records": [{"text": "good film"}] * 10_000}).encode()),
    "10,001 rows": ("application/json", json.dumps({"dataframe_records": [{"text": "good film"}] * 10_001}).encode()),
    "text/plain": ("text/plain", b"a good film"),
}


def post(connection: http.client.HTTPConnection, content_type: str, body: bytes) -> tuple[int, bytes]:
    connection.request("POST", "/invocations", body=body, headers={"Content-Type": content_type})
    response = connection.getresponse()
    return response.status, response.read()


def records(texts: Sequence[str], start: int, size: int) -> bytes:
    rows = [{"text": texts[(start + i) % len(texts)]} for i in range(size)]
    return json.dumps({"dataframe_records": rows}).encode()


def load(port: int, texts: Sequence[str], clients: int, batch: int, seconds: float) -> dict:
    """``clients`` threads posting ``batch`` rows each until ``seconds`` pass: throughput and latency."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        start = index * batch
        mine, failed = [], 0
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            try:
                status, _ = post(connection, "application/json", records(texts, start, batch))
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                status = 0
            mine.append(time.perf_counter() - began)
            failed += status != 200
            start += batch * clients
        connection.close()
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    began = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    times = np.asarray(latencies) * 1000
    return {
        "clients": clients,
        "batch": batch,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "rows_per_s": round(len(latencies) * batch / elapsed, 1),
        "p50_ms": round(float(np.percentile(times, 50)), 1) if len(times) else None,
        "p99_ms": round(float(np.percentile(times, 99)), 1) if len(times) else None,
        "errors": errors[0],
    }


def tree_rss(port: int) -> int:
    """The resident memory of the processes listening on ``port`` and their parents and children (the server)."""
    roots = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.pid}
    seen: set[int] = set()
    for pid in roots:
        process = psutil.Process(pid)
        family = [process, *process.parents()[:1], *process.children(recursive=True)]
        seen |= {p.pid for p in family}
    total = 0
    for pid in seen:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def bad_requests(port: int, requests: dict[str, tuple[str, bytes]] = BAD_REQUESTS) -> list[dict]:
    """Each bad request once: its status, the first line of the answer, and the next good request's status."""
    rows = []
    for name, (content_type, body) in requests.items():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        began = time.perf_counter()
        try:
            status, answer = post(connection, content_type, body)
        except (OSError, http.client.HTTPException) as error:
            status, answer = 0, str(error).encode()
        seconds = time.perf_counter() - began
        connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        after, _ = post(connection, "application/json", records(["A fine film."], 0, 1))
        connection.close()
        text = answer.decode("utf-8", "replace").strip().splitlines()[0] if answer.strip() else ""
        rows.append(
            {"request": name, "status": status, "answer": text[:200], "seconds": round(seconds, 2), "next": after}
        )
    return rows


def measure_serving(
    tracking: TrackingConfig,
    model_uri: str,
    texts: Sequence[str],
    workers: Sequence[int] = (1, 2),
    clients: Sequence[int] = CLIENTS,
    seconds: float = 10.0,
    requests: dict[str, tuple[str, bytes]] = BAD_REQUESTS,
) -> dict:
    """The load table for each worker count, then the bad-request table (one worker)."""
    from pipeline.tracking import tracking_uri  # MLflow: only where the bench serves

    texts = list(texts)
    table = []
    bad: list[dict] = []
    for count in workers:
        port = free_port()
        environment = serve_environment(tracking_uri(tracking), model_uri)
        with local_server(serve_command(port, workers=count), port, "/ping", "make serve", env=environment):
            for batch in BATCHES:
                for number in clients:
                    peak = [tree_rss(port)]
                    done = threading.Event()

                    def sample(peak: list[int] = peak, done: threading.Event = done, port: int = port) -> None:
                        while not done.wait(0.5):
                            peak[0] = max(peak[0], tree_rss(port))

                    sampler = threading.Thread(target=sample)
                    sampler.start()
                    row = load(port, texts, number, batch, seconds)
                    done.set()
                    sampler.join()
                    table.append({"workers": count, **row, "peak_gb": round(peak[0] / 1e9, 2)})
                    print(f"bench: serve {table[-1]}", flush=True)
            if count == workers[0]:
                bad = bad_requests(port, requests)
    return {"model_uri": model_uri, "seconds_per_point": seconds, "load": table, "bad_requests": bad}
