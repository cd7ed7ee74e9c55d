"""The quality gates of ``pyproject.toml`` pass on the tree, and each fails on a file that breaks it.

``ruff check`` (lint: the rules ``[tool.ruff.lint]`` selects), ``ruff format --check`` (the formatter's layout) and
``mypy`` (types, over ``pipeline/`` and ``lab/``; a run of the whole suite starts it at once, beside the other
tests). They run here so that ``make test``, and CI with it, runs them; each control hands the same tool, with the
project's settings, a small file it must refuse.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import PROJECT_ROOT, TYPE_CHECK_ENV, TYPE_CONTROL, TYPE_CONTROL_SOURCE, type_check_command

PYPROJECT = PROJECT_ROOT / "pyproject.toml"


def tool(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def ruff(*args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess:
    return tool("ruff", *args, "--config", str(PYPROJECT), cwd=cwd)


def test_ruff_finds_nothing_to_fix_in_the_tree():
    result = ruff("check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_lint_control_an_unused_import_and_a_mutable_default_fail(tmp_path):
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f(items=[]):\n    return items\n")
    result = ruff("check", "bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout and "B006" in result.stdout


def test_the_tree_is_formatted():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_format_control_a_badly_formatted_file_fails(tmp_path):
    (tmp_path / "bad.py").write_text("x = {  'a':1,'b' : 2 }\n")
    result = ruff("format", "--check", "bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "bad.py" in result.stdout


def type_check(scratch: Path) -> tuple[int, str]:
    """mypy over ``pipeline/``, ``lab/`` and a control file with a wrong type, in one process: the run of the whole
    suite started it in the background (``tests/conftest.py``); a run of chosen files runs it here."""
    started = os.environ.get(TYPE_CHECK_ENV)
    if started:
        folder = Path(started)
        deadline = time.monotonic() + 600
        while not (folder / "returncode").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        return int((folder / "returncode").read_text()), (folder / "output.txt").read_text()
    (scratch / TYPE_CONTROL).write_text(TYPE_CONTROL_SOURCE)
    result = subprocess.run(type_check_command(scratch), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def test_mypy_finds_no_type_error_in_the_package_and_refuses_the_control(tmp_path):
    returncode, output = type_check(tmp_path)
    errors = [line for line in output.splitlines() if ": error:" in line]
    assert returncode == 1, output  # the control's error, and only it
    assert [line for line in errors if TYPE_CONTROL not in line] == [], output
    assert any('Incompatible return value type (got "list[str]", expected "int")' in line for line in errors), output
