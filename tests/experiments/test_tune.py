"""`make tune`: the search space is checked before any trial, a study runs, resumes after a kill and is shared
by two processes, and its best parameters come back as a config the comparison takes."""

import os
import shutil
import signal
import subprocess
import sys
import time

import mlflow
import optuna
import pytest
import yaml

from lab.__main__ import main as cli_main
from lab.experiments import tune
from pipeline.config import load_config
from pipeline.core.errors import ConfigError, InputError
from tests.conftest import PROJECT_ROOT

SPACE = {
    "training.learning_rate": {"low": 1e-3, "high": 1e-2, "log": True},
    "model.pooling": {"choices": ["first_token", "mean"]},
    "model.dropout": {"low": 0.0, "high": 0.2},
}


@pytest.fixture
def study_config(trained_run, tmp_path):
    """The trained fixture's tokenization, copied (the fixture stays untouched), and a tiny space."""
    config, _ = trained_run
    for stage in ("ingest", "tokenize"):
        shutil.copytree(config.data_dir / stage, tmp_path / "data" / stage)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    overrides = {
        "paths": {"data_dir": str(tmp_path / "data"), "reports_dir": str(tmp_path / "reports")},
        "tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        "training": {"epochs": 2},
        "tune": {
            "space": str(tmp_path / "space.yaml"),
            "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
            "trials": 3,
            "pruner_startup_trials": 1,
            "heartbeat_seconds": 1,
        },
    }
    return config.replace(**overrides)


def cli_args(config) -> list[str]:
    return [
        "--config",
        str(PROJECT_ROOT / "configs" / "smoke.yaml"),
        "--set",
        f"paths.data_dir={config.data_dir}",
        "--set",
        f"paths.reports_dir={config.reports_dir}",
        "--set",
        f"tracking.tracking_uri={config.tracking.tracking_uri}",
        "--set",
        "training.epochs=2",
        "--set",
        f"tune.space={config.tune.space}",
        "--set",
        f"tune.storage={config.tune.storage}",
        "--set",
        "tune.pruner_startup_trials=1",
        "--set",
        "tune.heartbeat_seconds=1",
    ]


# --------------------------------------------------------------------------- a cheap objective for the storage tests

CHEAP_TRIAL_SECONDS = "TEST_CHEAP_TRIAL_SECONDS"  # how long a cheap trial lasts (a subprocess reads it)
CHEAP_TRIAL_STARTED = "cheap trial: running"


def cheap_value(values: dict) -> float:
    """A deterministic objective over SPACE's parameters, in (0.5, 1): what a trial would score, without training."""
    import math

    return round(
        0.6
        + 0.2 * (values["model.pooling"] == "mean")
        + values["model.dropout"]
        - 0.05 * abs(math.log10(values["training.learning_rate"]) + 2.5),
        6,
    )


def cheap_trial(trial, base, parameters) -> float:
    """Stands in for ``tune.run_trial``: the same suggestions and user attributes, a value from ``cheap_value``."""
    values = {parameter.name: parameter.suggest(trial) for parameter in parameters}
    trial.set_user_attr("process", os.getpid())
    trial.set_user_attr("seconds", 0.0)
    print(CHEAP_TRIAL_STARTED, flush=True)
    time.sleep(float(os.environ.get(CHEAP_TRIAL_SECONDS, "0")))
    return cheap_value(values)


@pytest.fixture
def cheap_trials(monkeypatch):
    monkeypatch.setattr(tune, "run_trial", cheap_trial)


def main_with_cheap_trials(argv: list[str]) -> int:
    """``python -m lab tune ARGV`` with ``cheap_trial`` in place of training (for the subprocess tests)."""
    tune.run_trial = cheap_trial
    return cli_main(["tune", *argv])


def cheap_tune_process(config, trials: int, seconds: float) -> subprocess.Popen:
    """``make tune`` in a new process, each trial a cheap one lasting ``seconds``; this checkout's code (not
    whichever the environment has installed) and output unbuffered."""
    command = [
        sys.executable,
        "-c",
        "import sys; from tests.experiments.test_tune import main_with_cheap_trials; "
        "sys.exit(main_with_cheap_trials(sys.argv[1:]))",
        *cli_args(config),
        "--trials",
        str(trials),
    ]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        CHEAP_TRIAL_SECONDS: str(seconds),
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    return subprocess.Popen(
        command, cwd=config.data_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def test_the_cheap_objective_is_deterministic_and_separates_the_parameters(study_config, cheap_trials):
    """The control for the storage tests below: their trials run ``cheap_trial``, not training, and the study
    still sees values that differ by parameter, so "best" means something there."""
    tune.run(study_config)
    study = optuna.load_study(study_name=study_config.tune.study_name, storage=study_config.tune.storage)
    assert [t.value for t in study.trials] == [cheap_value(t.params) for t in study.trials]
    assert len({t.value for t in study.trials}) == 3 and all(0.5 < t.value < 1 for t in study.trials)
    assert all("mlflow_run_id" not in t.user_attrs for t in study.trials)  # nothing was trained
    assert not (study_config.data_dir / "train").exists()


@pytest.mark.parametrize(
    "space, message",
    [
        ({"model.hiden_dim": {"choices": [32]}}, "model.hiden_dim: unknown setting"),
        ({"training.learning_rate": {"low": 0.01, "high": 0.001}}, "training.learning_rate: empty range"),
        ({"model.hidden_dim": {"choices": [32, "wide"]}}, "model.hidden_dim must be an integer"),
        ({"model.pooling": {"choices": []}}, "model.pooling: choices must be a non-empty list"),
        ({"training.learning_rate": {"low": 0.0, "high": 0.1, "log": True}}, "log-scale range needs low > 0"),
        ({"paths.data_dir": {"choices": ["a", "b"]}}, "paths settings are not searched"),
    ],
)
def test_a_bad_search_space_is_refused_naming_the_key(space, message):
    with pytest.raises(ConfigError, match=message):
        tune.parse_space(space, load_config(), "space.yaml")


def test_the_shipped_search_space_covers_the_encoder_and_its_training():
    parameters = {
        p.name: p for p in tune.load_space(load_config(None, [f"tune.space={PROJECT_ROOT / 'configs' / 'tune.yaml'}"]))
    }
    for name in (
        "model.hidden_dim",
        "model.num_layers",
        "model.num_heads",
        "model.dropout",
        "training.learning_rate",
        "training.weight_decay",
        "training.warmup_fraction",
        "training.batch_size",
        "tokenizer.max_sequence_length",
        "tokenizer.truncation",
        "model.pooling",
    ):
        assert name in parameters, name
    assert parameters["training.learning_rate"].log and parameters["model.num_layers"].low == 1


def test_bad_input_is_one_error_line_before_any_trial(study_config, tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("model.hiden_dim: {choices: [32]}\n")
    assert cli_main(["tune", *cli_args(study_config), "--set", f"tune.space={tmp_path / 'typo.yaml'}"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "model.hiden_dim: unknown setting" in error[0]
    bad_url = f"sqlite:///{tmp_path / 'no' / 'such' / 'folder' / 'optuna.db'}"
    assert cli_main(["tune", *cli_args(study_config), "--set", f"tune.storage={bad_url}"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"cannot open {bad_url!r}" in error[0]
    assert not (study_config.reports_dir / "tune").exists()  # nothing ran


def test_a_study_logs_every_trial_and_hands_its_best_parameters_to_the_comparison(study_config, capsys):
    """The one test whose trials really train (tiny models, two epochs): the others use ``cheap_trial``."""
    best_file = tune.run(study_config)
    output = capsys.readouterr().out
    assert output.count("tune: trial ") == 3 and "best so far" in output
    study = optuna.load_study(study_name=study_config.tune.study_name, storage=study_config.tune.storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 3 and study.best_value > 0.5
    # the first trial is the configured settings: the bar the search has to beat
    assert study.trials[0].user_attrs["configured"] and "tune: trial 0 (the configured settings) " in output
    assert study.trials[0].params == {
        "training.learning_rate": study_config.training.learning_rate,
        "model.pooling": study_config.model.pooling,
        "model.dropout": study_config.model.dropout,
    }
    # the overlay is a whole config with the best parameters in place
    best = load_config(best_file)
    assert best.model.pooling == study.best_params["model.pooling"]
    assert best.training.learning_rate == pytest.approx(study.best_params["training.learning_rate"])
    assert best.training.epochs == 2 and best.tokenizer == study_config.tokenizer
    # MLflow: one parent for the study, one child per trial with its state
    mlflow.set_tracking_uri(study_config.tracking.tracking_uri)
    parent = mlflow.search_runs(
        experiment_names=[study_config.tracking.experiment_name],
        output_format="list",
        filter_string=f"tags.`{tune.STUDY_TAG}` = '{study_config.tune.study_name}'",
    )[0]
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(study.best_value)
    children = mlflow.search_runs(
        experiment_names=[study_config.tracking.experiment_name],
        output_format="list",
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    assert {run.data.tags[tune.STATE_TAG] for run in children} <= {"complete", "pruned"} and len(children) == 3
    for trial in finished:
        run = next(r for r in children if r.info.run_id == trial.user_attrs["mlflow_run_id"])
        assert run.data.params["model.pooling"] == trial.params["model.pooling"]
    artifacts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(parent.info.run_id, "tune")}
    assert {"tune/best.yaml", "tune/trials.csv", "tune/optimization_history.png"} <= artifacts
    assert ("has nothing to compare" in output) == bool(study.best_trial.user_attrs.get("configured"))
    # a rerun with the budget spent runs nothing more; it can write any complete trial's config
    other = next(t for t in finished if t.state == optuna.trial.TrialState.COMPLETE)
    written = tune.run(study_config, trial=other.number)
    assert "tune: trial " not in capsys.readouterr().out
    assert written == best_file.parent / f"trial-{other.number}.yaml"
    assert load_config(written).training.learning_rate == pytest.approx(other.params["training.learning_rate"])
    with pytest.raises(InputError, match="--trial 99: not a complete trial"):
        tune.run(study_config, trial=99)


def test_a_killed_study_resumes_and_its_interrupted_trial_is_failed_not_lost(study_config, cheap_trials):
    assert tune.run(study_config.replace(tune={"trials": 1})).is_file()  # creates both stores before the kill
    process = cheap_tune_process(study_config, trials=3, seconds=600)
    for line in process.stdout:
        if line.startswith(CHEAP_TRIAL_STARTED):  # a trial is running
            break
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    study = optuna.load_study(study_name=study_config.tune.study_name, storage=study_config.tune.storage)
    assert [t.state for t in study.trials][-1] == optuna.trial.TrialState.RUNNING  # left behind by the kill
    time.sleep(3)  # past the heartbeat's grace period
    tune.run(study_config)
    study = optuna.load_study(study_name=study_config.tune.study_name, storage=study_config.tune.storage)
    states = [t.state for t in study.trials]
    assert states[1] == optuna.trial.TrialState.FAIL and optuna.trial.TrialState.RUNNING not in states
    assert len(states) == 3


def test_two_processes_share_one_study(study_config, cheap_trials):
    config = study_config.replace(tune={"trials": 1})
    tune.run(config)  # both stores exist before two writers start
    processes = [cheap_tune_process(study_config, trials=5, seconds=2) for _ in range(2)]  # 2 s: as long as a trial
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    study = optuna.load_study(study_name=study_config.tune.study_name, storage=study_config.tune.storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert 5 <= len(finished) <= 6  # each process stops once 5 are finished; one may be mid-trial then
    assert len({t.user_attrs.get("process") for t in finished[1:]}) == 2  # both worked on it
    assert {t.user_attrs.get("process") for t in finished[1:]} == {process.pid for process in processes}


def test_optunas_experimental_heartbeat_notice_is_a_known_warning(tmp_path):
    """The heartbeat storage is used as Optuna documents it: its experimental notice must not reach users."""
    import warnings

    from pipeline.core.logs import ignore_known_warnings

    def notices(quiet: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if quiet:
                ignore_known_warnings()
            tune.open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
        return [str(w.message) for w in caught if "experimental" in str(w.message)]

    assert notices(quiet=False)  # the control: Optuna does warn
    assert notices(quiet=True) == []


def test_the_configured_values_that_lie_outside_the_space_are_left_to_the_sampler():
    config = load_config(None, ["training.learning_rate=0.5", "model.pooling=mean", "model.dropout=0.1"])
    parameters = tune.parse_space(SPACE, config, "space.yaml")
    assert tune.configured_values(config, parameters) == {"model.pooling": "mean", "model.dropout": 0.1}
    assert (
        tune.configured_values(config.replace(model={"pooling": "first_token"}), parameters)["model.pooling"]
        == "first_token"
    )
