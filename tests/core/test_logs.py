"""A default run is quiet (``pipeline.core.logs``): stage summaries, the pipeline's own progress bars and errors, not
MLflow's INFO/WARNING lines, its artifact-download bars or known third-party warnings, which go to a log file
(``PIPELINE_LOG_FILE``) instead; ``-v`` shows them."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import PROJECT_ROOT

NOISE = (
    "INFO mlflow",
    "WARNING mlflow",
    "Downloading artifacts",
    "UserWarning",
    "cuInit",
    "cuda drivers",
    "Creating initial MLflow database tables",
    "CloudPickle",
    "Successfully registered model",
    "Created version",
)


def run_stage(config, stage: str, log_file) -> str:
    command = [
        sys.executable,
        "-m",
        "pipeline",
        stage,
        "--config",
        str(PROJECT_ROOT / "configs" / "smoke.yaml"),
        "--set",
        f"paths.data_dir={config.data_dir}",
        "--set",
        f"paths.reports_dir={config.reports_dir}",
        "--set",
        "training.epochs=1",
        "--set",
        "compare.seeds=[1]",
    ]
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("PIPELINE_", "MLFLOW_"))}
    environment.update(
        PYTHONPATH=str(PROJECT_ROOT),
        PIPELINE_LOG_FILE=str(log_file),
        PIPELINE_QUIET="1",
        MLFLOW_TRACKING_URI=f"sqlite:///{config.data_dir.parent / 'quiet.db'}",
    )
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=600, cwd=config.data_dir.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_default_run_shows_summaries_not_mlflows_log_lines_which_go_to_the_log_file(prepared_config, tmp_path):
    log_file = tmp_path / "third_party.log"
    output = run_stage(prepared_config, "train", log_file) + run_stage(prepared_config, "evaluate", log_file)
    assert "train: read " in output and "evaluate: read " in output  # the stage summaries
    assert [noise for noise in NOISE if noise in output] == []
    logged = log_file.read_text()
    assert "Creating initial MLflow database tables" in logged and "INFO mlflow." in logged


def test_mlflows_loggers_write_to_the_file_and_not_the_terminal(tmp_path, monkeypatch, capsys):
    import logging

    from pipeline.core.logs import LOGGED_THIRD_PARTIES, log_third_parties_to_file

    for name in LOGGED_THIRD_PARTIES:  # restored after the test: this worker's other tests keep MLflow's own
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "propagate", logger.propagate)
    environ = {"PIPELINE_LOG_FILE": str(tmp_path / "third.log")}
    assert log_third_parties_to_file(environ) == str(tmp_path / "third.log")
    assert log_third_parties_to_file(environ) == str(tmp_path / "third.log")  # twice: one handler
    assert environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    logging.getLogger("mlflow.store.db.utils").warning("a line for the file")
    logging.getLogger("mlflow").handlers[0].flush()
    assert len(logging.getLogger("mlflow").handlers) == 1
    assert "WARNING mlflow.store.db.utils: a line for the file" in (tmp_path / "third.log").read_text()
    assert "a line for the file" not in "".join(capsys.readouterr())


def test_what_mlflow_prints_goes_to_the_file_unless_verbose(tmp_path, capsys):
    """MLflow's registry prints its notices (``eprint``) instead of logging them: quiet, they go to the log file."""
    from mlflow.utils.logging_utils import eprint

    from pipeline.core.logs import printed_to_log

    environ = {"PIPELINE_LOG_FILE": str(tmp_path / "third.log")}
    with printed_to_log(environ):
        eprint("Successfully registered model 'x'.")
    assert "Successfully registered model 'x'." in (tmp_path / "third.log").read_text()
    assert "Successfully registered" not in "".join(capsys.readouterr())
    with printed_to_log({**environ, "PIPELINE_VERBOSE": "1"}):
        eprint("Created version '1' of model 'x'.")
    assert "Created version '1'" in capsys.readouterr().err  # the control: shown when verbose
