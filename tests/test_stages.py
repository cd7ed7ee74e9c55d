"""The stage and experiment tables: the CLIs (``python -m pipeline`` for the stages, ``python -m lab`` for the
experiments), `make help` and the README agree with them; --force and errors behave."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.__main__ import build_parser as lab_parser
from lab.__main__ import main as lab_main
from lab.experiments import EXPERIMENTS
from pipeline import stages
from pipeline.__main__ import build_parser
from pipeline.__main__ import main as cli_main
from pipeline.core import catalog
from pipeline.core.errors import MissingInputError
from tests.conftest import PROJECT_ROOT

EVERYTHING = {**stages.STAGES, **EXPERIMENTS}


def subcommands(parser=None) -> dict:
    """The sub-commands of ``parser``: the product's command line by default."""
    action = next(a for a in (parser or build_parser())._actions if a.dest == "stage")
    return action.choices


def test_each_cli_offers_its_own_table_and_nothing_else():
    assert set(subcommands()) == set(stages.STAGES)  # the product's: no experiment
    assert set(subcommands(lab_parser())) == set(EXPERIMENTS)  # the lab's: no stage
    assert not set(stages.STAGES) & set(EXPERIMENTS)


def test_force_is_offered_exactly_where_the_stage_honours_it():
    for name, sub in {**subcommands(), **subcommands(lab_parser())}.items():
        options = {option for action in sub._actions for option in action.option_strings}
        assert ("--force" in options) == EVERYTHING[name].force, name


def test_every_stage_module_has_a_main_and_its_upstream_stages_exist():
    import importlib

    for stage in EVERYTHING.values():
        assert callable(importlib.import_module(stage.module).main), stage.module
        assert set(stage.reads) <= set(EVERYTHING), stage.name
    for stage in stages.STAGES.values():  # the product never reads what an experiment writes
        assert set(stage.reads) <= set(stages.STAGES), stage.name


def readme_table(heading: str) -> set[str]:
    """The ``make`` targets of the first table under ``heading`` in the README."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme.split(heading, 1)[1]
    table = section[section.index("\n|") :].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `make ([a-z-]+)", table, flags=re.MULTILINE))


def test_readme_lists_the_stages_and_the_experiments_as_two_groups():
    assert set(stages.STAGES) <= readme_table("## Stages") and not set(EXPERIMENTS) & readme_table("## Stages")
    assert set(EXPERIMENTS) <= readme_table("## Experiments")


AUDITS = {"faults"}  # the lab's audits of the whole product (lab/audits/): listed with the experiments


def test_make_help_lists_every_stage_then_every_experiment():
    result = subprocess.run(["make", "-s", "help"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    product, experiments = result.stdout.split("Experiments", 1)
    listed = lambda text: set(re.findall(r"^\s+make ([a-z-]+)\s", text, flags=re.MULTILINE))  # noqa: E731
    assert set(stages.STAGES) <= listed(product) and not set(EXPERIMENTS) & listed(product)
    assert set(EXPERIMENTS) | AUDITS == listed(experiments)


def test_require_output_names_the_make_target(smoke_config):
    with pytest.raises(MissingInputError, match=r"no tokenize output in .*: run `make tokenize` first"):
        catalog.require_output(smoke_config, "tokenize")
    assert catalog.stage_dir(smoke_config, "ingest") == smoke_config.data_dir / "ingest"


def test_user_mistakes_are_one_line_and_bugs_keep_their_traceback(smoke_config, monkeypatch, capsys):
    assert cli_main(["train", "--set", f"paths.data_dir={smoke_config.data_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no tokenize output") and err.count("\n") == 1
    assert cli_main(["ingest", "--set", "model.pooling=max"]) == 2
    assert "model.pooling must be one of" in capsys.readouterr().err

    from pipeline.stages import register

    def bug(config, args):
        raise KeyError("a bug, not a user's mistake")

    monkeypatch.setattr(register, "main", bug)
    with pytest.raises(KeyError, match="a bug"):
        cli_main(["register"])


def test_bench_is_an_experiment_of_the_lab_with_one_line_errors(smoke_config, capsys):
    code = lab_main(["bench", "--set", f"paths.data_dir={smoke_config.data_dir}"])
    assert code == 2 and "run `make tokenize` first" in capsys.readouterr().err
    assert lab_main(["bench", "--rows", "0"]) == 2
    assert "--rows and --repeat must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # not a stage of the product
        cli_main(["bench"])
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_python_m_lab_runs_an_experiment_from_the_checkout():
    """The lab is not installed: ``python -m lab`` runs from the checkout's root, and its help lists the experiments."""
    result = subprocess.run(
        [sys.executable, "-m", "lab", "--help"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m lab") and all(name in result.stdout for name in EXPERIMENTS)


def test_force_reruns_ingest_tokenize_train_and_evaluate(smoke_config, capsys):
    """Each stage says "up to date" on a second run and really reruns with --force."""
    config_args = [
        "--config",
        str(PROJECT_ROOT / "configs" / "smoke.yaml"),
        "--set",
        f"data.archive={smoke_config.data.archive}",
        "--set",
        f"paths.data_dir={smoke_config.data_dir}",
        "--set",
        f"paths.reports_dir={smoke_config.reports_dir}",
        "--set",
        "training.epochs=1",
    ]
    for stage in ("ingest", "tokenize", "train", "evaluate"):
        assert cli_main([stage, *config_args]) == 0, stage
        capsys.readouterr()
        assert cli_main([stage, *config_args]) == 0
        assert "up to date" in capsys.readouterr().out, stage
        written = {
            "ingest": "data/ingest/manifest.json",
            "tokenize": "data/tokenize/manifest.json",
            "train": "data/train/*/manifest.json",
            "evaluate": "reports/*/metrics.json",
        }[stage]
        (output_file,) = smoke_config.data_dir.parent.glob(written)
        before = output_file.stat().st_mtime_ns
        assert cli_main([stage, *config_args, "--force"]) == 0
        output = capsys.readouterr().out
        assert "up to date" not in output and f"{stage}: read" in output, stage
        assert output_file.stat().st_mtime_ns != before, stage


def make_setup_plan(venv: Path, path: str, *settings: str) -> str:
    """What `make setup` would run (``make -n``) for the environment ``venv`` with ``path`` as PATH."""
    result = subprocess.run(
        ["make", "-n", "setup", f"VENV={venv}", *settings],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": path, "HOME": str(venv.parent)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_setup_adds_the_gpu_runtime_of_the_chosen_backend_after_a_cpu_install(tmp_path):
    venv, fake = tmp_path / "venv", tmp_path / "fake-driver"
    (venv / "bin").mkdir(parents=True)
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI 580.00'\n")
    (fake / "nvidia-smi").chmod(0o755)
    (venv / ".installed-cpu").touch()  # a CPU install, newer than the locks
    system = os.environ["PATH"]
    assert "pip install" not in make_setup_plan(venv, system, "GPU=")
    with_driver = f"{fake}:{system}"
    jax = make_setup_plan(venv, with_driver, "BACKEND=jax")
    assert "pip install --require-hashes -r requirements-gpu-jax.lock" in jax
    assert f"touch {venv}/.installed-gpu-jax" in jax
    tensorflow = make_setup_plan(venv, with_driver)
    assert "-r requirements-gpu-tensorflow.lock" in tensorflow and "gpu-jax" not in tensorflow
    (venv / ".installed-gpu-jax").touch()
    assert "pip install" not in make_setup_plan(venv, with_driver, "BACKEND=jax")  # installed once, then stamped
    (venv / ".installed-gpu-jax").unlink()  # GPU=1 asks for it on a machine without a driver too
    assert "-r requirements-gpu-jax.lock" in make_setup_plan(venv, system, "GPU=1", "BACKEND=jax")


@pytest.mark.parametrize(
    ("config", "scored"),
    [
        ("configs/default.yaml", "reports/example_scored.csv"),
        ("configs/short_texts.yaml", "reports/short_texts/example_scored.csv"),
    ],
)
def test_make_all_of_another_config_writes_its_scored_example_apart(config, scored):
    result = subprocess.run(
        ["make", "-n", "all", f"CONFIG={config}", "PYTHON=python"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"--output {scored} " in result.stdout


def test_setup_with_a_python_other_than_3_11_is_one_error_line(tmp_path):
    python = tmp_path / "python3.12"
    python.write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.12.1" && exit 0\nexit 1\n')  # -c checks fail
    python.chmod(0o755)
    done = subprocess.run(
        ["make", "-s", "setup", f"VENV={tmp_path / 'venv'}", f"PYTHON3={python}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and not (tmp_path / "venv").exists()
    assert f"error: the locks are for Python 3.11 and {python} is Python 3.12.1" in done.stderr
