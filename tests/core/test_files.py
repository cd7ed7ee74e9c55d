"""Files the pipeline writes atomically get the mode a plain ``open(path, "w")`` would give them (``0o666`` less the
umask), not ``tempfile.mkstemp``'s ``0o600``: reports and stage outputs stay readable for other users."""

import contextlib
import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.config import load_config
from pipeline.core.files import (
    atomic_dump,
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
    current_umask,
    new_file_mode,
    staged_directory,
)
from tests.conftest import PROJECT_ROOT

UMASKS = {0o022: 0o644, 0o077: 0o600, 0o002: 0o664}  # umask -> the mode open(path, "w") gives a new file


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def octal(mask: int) -> str:
    return f"umask{mask:03o}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_modes_are_those_open_gives(tmp_path):
    for mask, expected in UMASKS.items():
        with umask(mask):
            with open(tmp_path / f"plain-{mask:o}", "w"):
                pass
            assert mode(tmp_path / f"plain-{mask:o}") == expected == new_file_mode()
            assert current_umask() == mask
            assert current_umask() == mask  # reading it leaves it as it was


WRITERS = {
    "text": lambda path: atomic_write_text(path, "report\n"),
    "json": lambda path: atomic_write_json(path, {"accuracy": 0.9}),
    "parquet": lambda path: atomic_write_parquet(pd.DataFrame({"a": [1, 2]}), path),
    "joblib": lambda path: atomic_dump({"model": [1, 2, 3]}, path),
}


@pytest.mark.parametrize("mask", sorted(UMASKS), ids=octal)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_atomic_write_gets_the_umask_mode(writer, mask, tmp_path):
    path = tmp_path / "reports" / f"out.{writer}"
    with umask(mask):
        WRITERS[writer](path)
    assert mode(path) == UMASKS[mask]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_rewriting_a_private_file_gives_the_umask_mode(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old\n")
    path.chmod(0o600)
    with umask(0o022):
        atomic_write_text(path, "new\n")
    assert mode(path) == 0o644 and path.read_text() == "new\n"


def test_the_control_a_mkstemp_file_fails_the_mode_assertion(tmp_path):
    """What ``atomic_replace`` did before: the same assertion fails on a file written through ``mkstemp`` alone."""
    with umask(0o022):
        handle, name = tempfile.mkstemp(dir=tmp_path)
        os.close(handle)
        os.replace(name, tmp_path / "report.md")
    assert mode(tmp_path / "report.md") == 0o600 != UMASKS[0o022]


@pytest.mark.parametrize("mask", sorted(UMASKS), ids=octal)
def test_a_staged_stage_folder_gets_the_umask_mode(mask, tmp_path):
    with umask(mask):
        with staged_directory(tmp_path / "data" / "ingest") as staging:
            (staging / "train.parquet").write_bytes(b"x")
    assert mode(tmp_path / "data" / "ingest") == 0o777 & ~mask


class ConstantModel:
    """A stand-in for a ``PipelineModel`` in the CSV scorer (its output file, not its scores, is under test)."""

    labels = ["negative", "positive"]

    def prepare(self, texts):
        return list(texts)

    def score(self, prepared):
        return np.tile(np.array([[0.25, 0.75]], dtype=np.float32), (len(prepared), 1))


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=octal)
def test_the_csv_scorer_output_gets_the_umask_mode(mask, tmp_path, monkeypatch):
    from pipeline.stages.score import csv_file as scoring

    monkeypatch.setattr(scoring, "load_classifier", lambda uri: ConstantModel())
    config = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml", [f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    )
    pd.DataFrame({"text": ["good", "bad", ""]}).to_csv(tmp_path / "in.csv", index=False)
    with umask(mask):
        counts = scoring.score_csv(
            config.tracking, tmp_path / "in.csv", tmp_path / "scored" / "out.csv", model_uri="constant"
        )
    assert counts["rows"] == 3 and counts["errors"] == 1
    assert mode(tmp_path / "scored" / "out.csv") == UMASKS[mask]
    assert [p.name for p in (tmp_path / "scored").iterdir()] == ["out.csv"]
