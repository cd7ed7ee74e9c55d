"""The quality gates of ``pyproject.toml`` pass on the tree, and each fails on a file that breaks it.

``ruff check`` (lint: the rules ``[tool.ruff.lint]`` selects), ``ruff format --check`` (the formatter's layout) and
``mypy`` (types, over ``pipeline/``). They run here so that ``make test``, and CI with it, runs them; each control
hands the same tool, with the project's settings, one small file it must refuse.
"""

import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT_ROOT

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


def test_mypy_finds_no_type_error_in_the_package(tmp_path):
    result = tool("mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_type_control_a_wrong_type_fails(tmp_path):
    (tmp_path / "bad.py").write_text("def words(text: str) -> int:\n    return text.split()\n")
    result = tool(
        "mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(tmp_path / "cache"), "bad.py", cwd=tmp_path
    )
    assert result.returncode == 1 and 'Incompatible return value type (got "list[str]", expected "int")' in (
        result.stdout
    )
