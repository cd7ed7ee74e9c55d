"""The catalog (``pipeline.core.catalog``): each stage's output folder is named once, and ``make clean`` deletes every
one of them (and the reports), nothing else."""

import shutil
import subprocess

import pytest

from pipeline.core import catalog
from tests.conftest import PROJECT_ROOT


def make_clean(data_dir, reports_dir) -> None:
    subprocess.run(
        ["make", "-s", "-C", str(PROJECT_ROOT), "clean", f"DATA={data_dir}", f"REPORTS={reports_dir}"],
        check=True,
        capture_output=True,
        text=True,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_deletes_every_stage_folder_of_the_catalog_and_the_reports_and_keeps_the_raw_data(tmp_path):
    data, reports = tmp_path / "data", tmp_path / "reports"
    kept = [data / "raw", data / "examples"]
    for folder in [data / name for name in catalog.FOLDERS.values()] + kept + [reports]:
        folder.mkdir(parents=True)
        (folder / "file.txt").write_text("x")
    (reports / "short_texts").mkdir()  # another config's reports inside the default's: not the default's to delete
    (reports / "short_texts" / "comparison.md").write_text("x")
    make_clean(data, reports)
    assert sorted(path.name for path in data.iterdir()) == ["examples", "raw"]
    assert [path.name for path in reports.iterdir()] == ["short_texts"]
    assert all((folder / "file.txt").is_file() for folder in kept)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_of_another_config_deletes_its_own_data_and_reports_and_nothing_of_the_defaults():
    lines = subprocess.run(
        ["make", "-n", "-s", "-C", str(PROJECT_ROOT), "clean", "CONFIG=configs/short_texts.yaml"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    (removal,) = [line for line in lines if line.startswith("rm -rf")]
    dry_run = removal.split()
    assert dry_run[:2] == ["rm", "-rf"]
    assert dry_run[2:] and all(path.startswith(("data/short_texts/", "reports/short_texts/")) for path in dry_run[2:])
    assert "data/short_texts/ingest" in dry_run


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_misses_a_folder_the_catalog_gains(tmp_path, monkeypatch):
    """The control: a stage folder that the Makefile does not list survives, so the test above would fail."""
    data = tmp_path / "data"
    (data / "new_stage").mkdir(parents=True)
    monkeypatch.setitem(catalog.FOLDERS, "new-stage", "new_stage")
    make_clean(data, tmp_path / "reports")
    assert [path.name for path in data.iterdir()] == ["new_stage"]
