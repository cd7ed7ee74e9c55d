"""The fault harness (``lab.audits.faults``): a kill takes the whole process group at its moment and names the stage
it hit; a command that ends first is not counted a kill; the report counts kills and survivors per stage."""

import os
import time
from pathlib import Path

from lab.audits.faults import report, run


def test_a_kill_takes_the_whole_process_group_and_names_the_stage_it_hit(tmp_path):
    script = (
        "echo '.venv/bin/python -m pipeline ingest'; echo '.venv/bin/python -m pipeline tokenize'; "
        f"sleep 60 & echo $! > {tmp_path / 'child'}; wait"
    )
    started = time.perf_counter()
    status, stage = run(["sh", "-c", script], dict(os.environ), tmp_path / "log", kill_after=1.0)
    assert status is None and stage == "tokenize" and time.perf_counter() - started < 30
    child = Path(f"/proc/{int((tmp_path / 'child').read_text())}/stat")
    time.sleep(0.2)
    # the group's other process went with it: gone, or dead and waiting to be reaped (a zombie)
    assert not child.exists() or child.read_text().split(") ")[1][0] in "ZX"
    assert run(["sh", "-c", "exit 3"], dict(os.environ), tmp_path / "other", kill_after=30) == (3, None)


def test_the_report_counts_kills_and_reruns_that_left_the_reference_per_stage():
    trials = [
        {"at": 1.0, "stage": "ingest", "differences": []},
        {"at": 9.0, "stage": "compare", "differences": []},
        {"at": 12.0, "stage": "compare", "differences": ["2 registered versions, champion 2"]},
    ]
    text = report(trials, 20.0)
    assert "| compare | 2 | 1 |" in text and "| ingest | 1 | 1 |" in text and "| all | 3 | 2 |" in text
    assert "- kill at 12.0 s (compare): ['2 registered versions, champion 2']" in text
