"""One set of defaults: ``pipeline/config/`` declares them, every shipped config only overrides them.

So ``make train`` (which passes ``--config configs/default.yaml``) and ``python -m pipeline train`` (no
``--config``) train the same model; a config file that restates a default is a second source of it.
"""

import shlex
import subprocess

import yaml

from pipeline.__main__ import build_parser
from pipeline.config import load_config
from tests.conftest import PROJECT_ROOT

CONFIGS = PROJECT_ROOT / "configs"
SEARCH_SPACE = "tune.yaml"  # make tune's search space, not a config


def restated_defaults(path) -> list[str]:
    """The ``section.key`` values ``path`` sets to what the built-in default already is."""
    defaults = load_config(None).to_dict()
    restated = []
    for section, values in (yaml.safe_load(path.read_text()) or {}).items():
        for key, value in (values or {}).items():
            default = defaults[section][key]
            if (list(default) if isinstance(default, tuple) else default) == value:
                restated.append(f"{section}.{key}")
    return restated


def make_arguments(target: str, *variables: str):
    """The parsed arguments of the command ``make <target> <variables>`` runs (``make -n``: nothing runs)."""
    result = subprocess.run(
        ["make", "-n", target, "PYTHON=python", *variables],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    line = next(li for li in result.stdout.splitlines() if f"-m pipeline {target}" in li)
    argv = shlex.split(line)
    return build_parser().parse_args(argv[argv.index("pipeline") + 1 :])


def test_make_train_and_python_m_pipeline_train_resolve_to_the_same_config():
    args = make_arguments("train")
    assert args.config == "configs/default.yaml" and args.overrides == []
    assert load_config(PROJECT_ROOT / args.config) == load_config(None)


def test_the_comparison_check_catches_a_drifted_default_file(tmp_path):
    """The control: a default.yaml that sets one value of its own no longer equals the built-in defaults."""
    drifted = tmp_path / "default.yaml"
    drifted.write_text("model:\n  dropout: 0.1\n")
    assert load_config(drifted) != load_config(None)


def test_no_shipped_config_restates_a_default():
    shipped = sorted(path for path in CONFIGS.glob("*.yaml") if path.name != SEARCH_SPACE)
    assert {path.name for path in shipped} >= {"default.yaml", "smoke.yaml", "gpu.yaml", "example_multiclass.yaml"}
    assert {path.name: restated_defaults(path) for path in shipped} == {path.name: [] for path in shipped}


def test_a_restated_default_is_found(tmp_path):
    restating = tmp_path / "restating.yaml"
    restating.write_text("model:\n  pooling: first_token\n  hidden_dim: 32\ncompare:\n  seeds: [1, 2, 3]\n")
    assert restated_defaults(restating) == ["model.pooling", "compare.seeds"]


def test_make_variables_reach_the_stage():
    """DATA=folder becomes paths.data_dir; POOLING= becomes model.pooling (what make passes, not only its file
    targets)."""
    args = make_arguments("train", "DATA=elsewhere", "POOLING=mean")
    config = load_config(PROJECT_ROOT / args.config, args.overrides)
    assert config.paths.data_dir == "elsewhere" and config.model.pooling == "mean"
