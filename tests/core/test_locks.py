"""One writer per data folder (``pipeline.core.locks``), with real processes: a second writer stops at once with one
line naming the first, ``make clean`` too, a reader takes no lock, and a killed writer leaves no stale lock."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pipeline.__main__ import build_parser, takes_lock
from pipeline.core.locks import LOCK_FILE, writer_lock
from tests.conftest import PROJECT_ROOT

HOLDER = """
import sys, time
from pipeline.core.locks import writer_lock
with writer_lock(sys.argv[1], "python -m pipeline compare --config configs/smoke.yaml"):
    print("holding", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    data = tmp_path / "data"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data)], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "holding"
    yield data, process
    process.kill()
    process.wait()


def pipeline_command(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIPELINE_VERBOSE": "1", **(env or {})},  # no TensorFlow start-up: the lock comes first
    )


def test_a_second_writer_stops_at_once_naming_the_first_and_runs_once_the_first_is_killed(holder, tiny_imdb_archive):
    data, process = holder
    settings = ["--config", "configs/smoke.yaml", "--set", f"paths.data_dir={data}"]
    settings += ["--set", f"data.archive={tiny_imdb_archive}"]
    started = time.perf_counter()
    refused = pipeline_command("ingest", *settings)
    assert refused.returncode == 2 and time.perf_counter() - started < 60
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: `python -m pipeline compare --config configs/smoke.yaml` (process ")
    assert f"is writing {data}/; wait for it to finish" in line
    assert not (data / "ingest").exists()  # nothing written
    process.send_signal(signal.SIGKILL)  # a kill leaves no stale lock: the kernel releases it
    process.wait()
    done = pipeline_command("ingest", *settings)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (data / "ingest" / "manifest.json").is_file()


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("flock") is None, reason="needs make and flock")
def test_make_clean_refuses_while_a_writer_holds_the_folder(holder):
    data, _ = holder
    (data / "ingest").mkdir()
    done = subprocess.run(
        ["make", "-s", "-C", str(PROJECT_ROOT), "clean", f"DATA={data}", f"REPORTS={data.parent / 'reports'}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "is writing" in done.stderr and (data / "ingest").is_dir()


def test_readers_take_no_lock_and_writers_do_but_a_non_chief_worker():
    parser = build_parser()
    for command, locks in (("score", False), ("serve", False), ("ui", False), ("compare", True), ("ingest", True)):
        args = parser.parse_args([command] + (["--input", "a", "--output", "b"] if command == "score" else []))
        assert takes_lock(args) is locks, command


def test_another_process_is_refused_while_the_block_runs_and_takes_the_lock_after(tmp_path):
    def other_process() -> subprocess.CompletedProcess:
        code = f"from pipeline.core.locks import writer_lock\nwith writer_lock({str(tmp_path)!r}, 'second'): pass"
        return subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True)

    with writer_lock(tmp_path, "first"):
        assert "`first` (process" in (tmp_path / LOCK_FILE).read_text()
        refused = other_process()
        assert refused.returncode != 0 and "BusyError: `first`" in refused.stderr
    assert other_process().returncode == 0


HOLDER_WITH_RUN = """
import sys, time
import mlflow
from pipeline.core.locks import writer_lock
with writer_lock(sys.argv[1], "python -m pipeline compare"):
    mlflow.set_tracking_uri(sys.argv[2])
    mlflow.set_experiment("smoke")
    with mlflow.start_run() as run:
        print(run.info.run_id, flush=True)
        time.sleep(120)
"""


def test_a_run_a_killed_command_left_running_is_marked_failed_by_the_next_writer(tmp_path, tiny_imdb_archive):
    import mlflow

    data, store = tmp_path / "data", f"sqlite:///{tmp_path / 'mlflow.db'}"
    killed = subprocess.Popen(
        [sys.executable, "-c", HOLDER_WITH_RUN, str(data), store], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
    )
    run_id = killed.stdout.readline().strip()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    client = mlflow.tracking.MlflowClient(store)
    assert client.get_run(run_id).info.status == "RUNNING"  # what the UI would show for ever
    settings = ["--config", "configs/smoke.yaml", "--set", f"paths.data_dir={data}"]
    settings += ["--set", f"data.archive={tiny_imdb_archive}", "--set", f"tracking.tracking_uri={store}"]
    first = pipeline_command("ingest", *settings)
    assert first.returncode == 0, first.stderr[-2000:]
    assert f"marked 1 MLflow run(s) a killed command left running as failed: {run_id}" in first.stdout
    assert client.get_run(run_id).info.status == "FAILED"
    again = pipeline_command("ingest", *settings)  # the control: the clean run before it left nothing to mark
    assert again.returncode == 0 and "marked" not in again.stdout
