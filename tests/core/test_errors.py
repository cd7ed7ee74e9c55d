"""The error rules: a user's mistake is a ``PipelineError``, shown as one ``error:`` line with exit status 2;
anything else is a bug and keeps its traceback, a bare ``FileNotFoundError`` included.

A user's missing file (config, ``--input``, archive, ``--model`` folder, tuned config, ...) is raised as
``MissingInputError`` naming the path; the user-fixable ``ValueError``s of the libraries are ``InputError`` or
``ConfigError`` (still ``ValueError``s).
"""

import importlib
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from pipeline.__main__ import main as cli_main
from pipeline.core.errors import ConfigError, InputError, MissingInputError, PipelineError
from pipeline.stages import STAGES
from tests.conftest import PROJECT_ROOT

SMOKE = str(PROJECT_ROOT / "configs" / "smoke.yaml")


def one_error_line(err: str) -> str:
    """The ``error:`` line that ends ``err``; fails on a traceback, on a second one or on none. (Lines before it are
    third-party log lines such as MLflow creating its store.)"""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and [line for line in lines if line.startswith("error:")] == lines[-1:], err
    return lines[-1]


# --------------------------------------------------------------------------- the command line


def test_a_missing_config_file_is_one_line_and_status_2(tmp_path, capsys):
    missing = tmp_path / "no-such.yaml"
    assert cli_main(["ingest", "--config", str(missing)]) == 2
    assert str(missing) in one_error_line(capsys.readouterr().err)


def test_a_missing_score_input_is_one_line_and_status_2(tmp_path, capsys):
    missing = tmp_path / "reviews.csv"
    assert cli_main(["score", "--config", SMOKE, "--input", str(missing), "--output", str(tmp_path / "out.csv")]) == 2
    assert str(missing) in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "out.csv").exists()


def test_a_missing_model_folder_is_one_line_naming_it(tmp_path, capsys):
    pd.DataFrame({"text": ["fine"]}).to_csv(tmp_path / "in.csv", index=False)
    missing = tmp_path / "no-model"
    assert (
        cli_main(
            [
                "score",
                "--config",
                SMOKE,
                "--input",
                str(tmp_path / "in.csv"),
                "--output",
                str(tmp_path / "out.csv"),
                "--model",
                str(missing),
            ]
        )
        == 2
    )
    line = one_error_line(capsys.readouterr().err)
    assert f"no model folder {missing}" in line


def test_serve_names_a_missing_model_folder_before_starting_a_server(tmp_path, capsys):
    missing = tmp_path / "no-model"
    assert cli_main(["serve", "--config", SMOKE, "--model", str(missing), "--port", "5199"]) == 2
    captured = capsys.readouterr()
    assert f"no model folder {missing}" in one_error_line(captured.err) and "serve:" not in captured.out


def test_a_missing_archive_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "missing.tar.gz"
    assert cli_main(["ingest", "--set", f"data.archive={missing}", "--set", f"paths.data_dir={tmp_path / 'd'}"]) == 2
    assert str(missing) in one_error_line(capsys.readouterr().err)


@pytest.fixture
def ui_stage():
    """The module of a light stage (found through the stage table, wherever it lives), to plant errors in."""
    return importlib.import_module(STAGES["ui"].module)


def test_a_bare_file_not_found_error_is_a_bug_and_propagates(ui_stage, monkeypatch, capsys):
    def bug(config, args):
        open("/nonexistent/folder/written-by-a-bug.txt")  # noqa: SIM115  a bug: no check, no message for a user

    monkeypatch.setattr(ui_stage, "main", bug)
    with pytest.raises(FileNotFoundError) as caught:
        cli_main(["ui", "--print-only"])
    assert not isinstance(caught.value, PipelineError)
    assert "error:" not in capsys.readouterr().err


def test_the_control_a_missing_input_error_from_the_same_place_is_one_line(ui_stage, monkeypatch, capsys):
    def user_mistake(config, args):
        raise MissingInputError("no such file: /somewhere/input.csv")

    monkeypatch.setattr(ui_stage, "main", user_mistake)
    assert cli_main(["ui", "--print-only"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: no such file: /somewhere/input.csv"


PLANTED = """
import importlib, sys
from pipeline.__main__ import main
from pipeline.core.errors import MissingInputError
from pipeline.stages import STAGES

def bug(config, args):
    open("/nonexistent/folder/written-by-a-bug.txt")

def user_mistake(config, args):
    raise MissingInputError("no such file: /somewhere/input.csv")

importlib.import_module(STAGES["ui"].module).main = {"bug": bug, "user": user_mistake}[sys.argv[1]]
sys.exit(main(["ui", "--print-only"]))
"""


def test_python_m_pipeline_prints_a_bugs_traceback_and_one_line_for_a_user_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}

    def run(kind: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", PLANTED, kind], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    bug = run("bug")
    assert bug.returncode == 1
    assert "Traceback (most recent call last)" in bug.stderr and "FileNotFoundError" in bug.stderr
    assert "written-by-a-bug.txt" in bug.stderr and "error:" not in bug.stderr
    user = run("user")
    assert user.returncode == 2
    assert one_error_line(user.stderr) == "error: no such file: /somewhere/input.csv"


# --------------------------------------------------------------------------- the libraries' missing files


def missing_file_calls(tmp_path, smoke_config):
    """(what, call) pairs: a library reading a user's file or folder at ``tmp_path / 'missing'``."""
    from pipeline.config import load_config
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.compare.designs import design_for
    from pipeline.stages.ingest.tables import find_table_files
    from pipeline.stages.pretrain.outputs import load_backbone, resolve_pretrained
    from pipeline.stages.score.csv_file import score_csv
    from pipeline.stages.score.spark import resolve_inputs
    from pipeline.text.conventions import load_labels

    missing = tmp_path / "missing"
    return {
        "config file": lambda: load_config(missing),
        "tuned config": lambda: design_for(smoke_config.replace(compare={"tuned": str(missing)}), "tuned"),
        "data.path table": lambda: find_table_files(str(missing)),
        "score --input": lambda: score_csv(smoke_config.tracking, missing, tmp_path / "out.csv"),
        "spark --input": lambda: resolve_inputs(str(missing)),
        "--model folder": lambda: load_classifier(str(missing)),
        "model.pretrained": lambda: resolve_pretrained(smoke_config.replace(model={"pretrained": str(missing)})),
        "pretrained backbone": lambda: load_backbone(missing),
        "labels": lambda: load_labels(missing),
    }


@pytest.mark.parametrize(
    "what",
    [
        "config file",
        "tuned config",
        "data.path table",
        "score --input",
        "spark --input",
        "--model folder",
        "model.pretrained",
        "pretrained backbone",
        "labels",
    ],
)
def test_a_users_missing_file_is_a_missing_input_error_naming_it(what, tmp_path, smoke_config):
    with pytest.raises(MissingInputError) as caught:
        missing_file_calls(tmp_path, smoke_config)[what]()
    assert str(tmp_path / "missing") in str(caught.value)
    assert isinstance(caught.value, FileNotFoundError)  # `except FileNotFoundError` still catches it


# --------------------------------------------------------------------------- user-fixable ValueErrors


def test_a_one_class_classifier_is_an_input_error():
    from pipeline.config import ModelConfig
    from pipeline.model.transformer import build_model

    with pytest.raises(InputError, match="at least 2 classes"):
        build_model(ModelConfig(), vocabulary_size=50, max_sequence_length=8, num_classes=1)


def test_nbsvm_on_one_class_is_an_input_error_and_still_a_value_error():
    from pipeline.lexical import NaiveBayesLogisticRegression

    with pytest.raises(InputError, match="two or more classes") as caught:
        NaiveBayesLogisticRegression().fit(sparse.csr_matrix(np.ones((3, 2))), np.array([1, 1, 1]))
    assert isinstance(caught.value, ValueError)


def test_an_empty_nbsvm_c_grid_is_a_config_error():
    from pipeline.lexical import nbsvm_baseline

    frame = pd.DataFrame({"text": ["good", "bad"], "label": [1, 0]})
    with pytest.raises(ConfigError, match="nbsvm.c_values"):
        nbsvm_baseline(frame, frame, c_values=())


def test_a_tracking_server_that_does_not_answer_is_one_line_naming_it(monkeypatch, capsys):
    """A team server stopped (nothing listens on its port): after MLflow's retries, one `error:` line naming the
    server and what to do, exit status 2, no traceback; any other MLflow error stays a bug with its traceback."""
    from mlflow.exceptions import MlflowException

    from pipeline.core.errors import unreachable_tracking_server
    from pipeline.runtime.local_http import free_port
    from tests.conftest import PROJECT_ROOT

    server = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    assert cli_main(["ui", "--config", str(PROJECT_ROOT / "configs" / "smoke.yaml"), "--print-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the MLflow tracking server {server} did not answer") and err.count("\n") == 1
    assert "then run the same command; what finished is kept" in err and "Traceback" not in err
    assert unreachable_tracking_server(MlflowException("RESOURCE_DOES_NOT_EXIST: no such run")) is None
    try:
        try:
            raise MlflowException(f"API request to {server}/api/2.0/mlflow/runs/get failed with exception boom")
        except MlflowException as inner:
            raise RuntimeError("while logging") from inner
    except RuntimeError as outer:
        assert unreachable_tracking_server(outer).startswith(f"the MLflow tracking server {server} did not answer")
