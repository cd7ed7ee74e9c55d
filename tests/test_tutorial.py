"""docs/tutorial.md walked for real: each of its commands run as written through `make` (on generated reviews with
configs/smoke.yaml, every output under a temporary folder), and each output line it shows matched, word for word
apart from figures, names and paths, by a line the command printed."""

import json
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lab.audits.faults import prepare_store
from pipeline.runtime.local_http import free_port
from tests.conftest import PROJECT_ROOT, make_archive, write_imdb_tree

TUTORIAL = PROJECT_ROOT / "docs" / "tutorial.md"
VARYING = re.compile(  # what differs between a build on IMDB and on generated reviews: figures, ids, paths, kinds
    r"[0-9a-f]{32}|[-+]?\d[\d,.]*%?|\S*[/@]\S*|\S+\.(csv|gz|md|json|png)\b|\bnbsvm\+?\w*|\bfirst_token\b|\bmean\b|\bfusion\b|\btransformer\b"
)


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.DOTALL)


def shape(line: str) -> re.Pattern:
    """``line`` as a pattern: its fixed words literal, what varies (``VARYING``) any run of non-space text."""
    parts, at = [], 0
    for match in VARYING.finditer(line):
        parts += [re.escape(line[at : match.start()]), r"\S+?"]
        at = match.end()
    return re.compile("".join([*parts, re.escape(line[at:])]).replace(r"\ ", r"\s+") + "$")


def shown(kind_prefix: str) -> list[str]:
    return [line for block in blocks("text") for line in block.splitlines() if line.startswith(kind_prefix)]


def assert_printed(expected: list[str], output: str) -> None:
    lines = output.splitlines()
    for line in expected:
        pattern = shape(line)
        assert any(pattern.match(got) for got in lines), f"the tutorial shows\n  {line}\nnot printed; got:\n{output}"


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """The environment and the variables every tutorial command runs with: generated reviews for IMDB_ARCHIVE, the
    smoke config, its outputs and MLflow store under a temporary folder."""
    folder = tmp_path_factory.mktemp("tutorial")
    write_imdb_tree(folder / "raw", unlabeled=20)
    archive = make_archive(folder / "raw", folder / "aclImdb_v1.tar.gz")
    prepare_store(folder)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    variables = [
        "CONFIG=configs/smoke.yaml",
        f"DATA={folder / 'data'}",
        f"REPORTS={folder / 'reports'}",
        f"SET=paths.reports_dir={folder / 'reports'} compare.seeds=[1] compare.tfidf_baseline=false training.epochs=1",
    ]
    return folder, archive, env, variables


def as_run(command: str, folder: Path, archive: Path, variables: list[str]) -> list[str]:
    """A tutorial command as the test runs it: files it names under ``folder``, the archive the generated one, and
    ``make`` given the walk's variables."""
    words = shlex.split(command.replace("aclImdb_v1.tar.gz", str(archive)))
    words = [re.sub(r"^(\w+=)?(\w+\.csv)$", rf"\g<1>{folder}/\g<2>", w) for w in words]
    at = words.index("make")
    return [*words[: at + 2], *variables, *words[at + 2 :]]


def run_make(words: list[str], env: dict, timeout: float = 600) -> str:
    assignments = dict(w.split("=", 1) for w in words[: words.index("make")])
    done = subprocess.run(
        words[words.index("make") :],
        cwd=PROJECT_ROOT,
        env={**env, **assignments},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def started(words: list[str], env: dict, port: int, path: str, timeout: float = 240) -> subprocess.Popen:
    """A foreground target (`make serve`, `make ui`) started on ``port``, once ``path`` answers."""
    process = subprocess.Popen(
        words, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5):
                return process
        except OSError:
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            time.sleep(1)
    stop(process)
    raise AssertionError(f"{words} did not answer on port {port}")


def stop(process: subprocess.Popen) -> str:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output or ""


def test_the_tutorial_runs_as_written_and_prints_what_it_shows(walk):
    folder, archive, env, variables = walk
    commands = [line for block in blocks("sh") for line in block.splitlines() if line.strip()]
    build, make_csv, score_cmd, ui_cmd, serve_cmd, curl_cmd = commands  # the steps, in the tutorial's order

    output = run_make(as_run(build, folder, archive, variables), env)  # 1. make all
    assert_printed(shown("ingest:") + shown("compare:") + shown("register:"), output)

    subprocess.run(make_csv.replace("my_reviews.csv", str(folder / "my_reviews.csv")), shell=True, check=True)
    output = run_make(as_run(score_cmd, folder, archive, variables), env)  # 2. make score
    assert_printed(shown("score:"), output)
    scored = (folder / "scored.csv").read_text().splitlines()
    assert scored[0].split(",")[-3:] == ["positive_probability", "predicted_label", "score_error"]
    assert len(scored) == 3 and "wonderful" in scored[1] and "Dull" in scored[2]  # every row, in order

    ui_port, serve_port = free_port(), free_port()
    ui = started([*as_run(ui_cmd, folder, archive, variables), f"UI_PORT={ui_port}"], env, ui_port, "/")  # 3.
    assert_printed(shown("ui:"), stop(ui).replace(f":{ui_port}", ":5000"))

    serve_words = [*as_run(serve_cmd, folder, archive, variables), f"SERVE_PORT={serve_port}"]
    server = started(serve_words, env, serve_port, "/ping")  # 4. make serve, then the tutorial's curl
    try:
        answer = subprocess.run(
            curl_cmd.replace(":5001/", f":{serve_port}/"), shell=True, capture_output=True, text=True, check=True
        ).stdout
    finally:
        printed = stop(server)
    assert "curl -s http://127.0.0.1:" in printed  # it prints the line to try
    (expected,) = [json.loads(line) for block in blocks("text") for line in block.splitlines() if line[:1] == "{"]
    got = json.loads(answer)["predictions"]
    assert len(got) == 1 and set(got[0]) == set(expected["predictions"][0])
    assert got[0]["predicted_label"] in ("negative", "positive")
