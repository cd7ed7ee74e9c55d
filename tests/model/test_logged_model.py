"""MLflow conventions that need no store: the pinned requirements of a logged model."""

import pytest

from pipeline.core.errors import PipelineError
from pipeline.model.logged_model import MODEL_DISTRIBUTIONS, pinned_requirements


def test_every_model_requirement_is_pinned_to_the_installed_version():
    from importlib.metadata import version

    pins = pinned_requirements()
    assert pins == [f"{name}=={version(name)}" for name in MODEL_DISTRIBUTIONS]
    assert "keras-hub" in MODEL_DISTRIBUTIONS and all("==" in pin and pin.split("==")[1] for pin in pins)


def test_a_distribution_that_is_not_installed_is_one_error_naming_it():
    with pytest.raises(PipelineError, match="cannot pin no-such-distribution-here"):
        pinned_requirements(("pandas", "no-such-distribution-here"))


def resolve_on_index(requirements: list[str]) -> tuple[bool, str]:
    """``pip install --dry-run`` of ``requirements`` against the package index: (resolved, pip's error output)."""
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode == 0, done.stderr


def test_the_pinned_requirements_resolve_on_the_package_index_and_a_missing_version_does_not():
    ok, error = resolve_on_index(["numpy==0.0.1"])  # the control: no such release
    if not ok and "from versions: none" in error:
        pytest.skip("the package index is not reachable from here")
    assert not ok and "numpy==0.0.1" in error
    ok, error = resolve_on_index(pinned_requirements())
    assert ok, error
