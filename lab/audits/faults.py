"""Kill ``make all`` at random moments and check that a rerun leaves what an uninterrupted run leaves.

On generated reviews (``tests.conftest.write_imdb_tree``: 200 per class and split, 300 unlabeled, seed 5) with
``configs/smoke.yaml`` and distillation on (so that every stage runs: ingest, tokenize, pseudo-label, each candidate,
register, score), each build in a folder of its own (data, reports, MLflow store and artifacts):

1. a reference build, uninterrupted, timed;
2. for each kill: a fresh build SIGKILLed as a whole process group at a random moment of the reference's duration, then
   the same command run again to the end;
3. the rerun against the reference: every value of ``comparison.json``'s summary (run ids and seconds aside), every
   stored ``*_predictions.parquet`` bit for bit (paired by candidate and seed, ``lab.audits.refactor_check``), the
   scored example, one registered version with the ``champion`` alias on it, no MLflow run left RUNNING, no temporary
   file (``.staging-``, ``.tmp``) left behind.

    python -m lab.audits.faults --kills 8 --out /tmp/faults     # or make faults KILLS=8; writes OUT/faults.{json,md}

The stage a kill hit is the last ``python -m pipeline <stage>`` make started before it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd

from lab.audits.refactor_check import candidate_folders, largest_difference, summary_figures
from pipeline.core.logs import ignore_known_warnings, log_third_parties_to_file

ROOT = Path(__file__).resolve().parents[2]
STAGE_LINE = re.compile(r"-m pipeline ([a-z-]+)")
EXPERIMENT = "smoke"
REGISTERED = "smoke-sentiment"


def run(command: list[str], env: dict, log: Path, kill_after: float | None = None) -> tuple[int | None, str | None]:
    """Run ``command`` (a new process group) writing to ``log``; with ``kill_after`` seconds, SIGKILL the whole group
    then unless it ended. Returns (exit status, None when killed; the stage running when killed)."""
    with log.open("a", encoding="utf-8") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            process.wait(timeout=kill_after)
            return process.returncode, None
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    stages = STAGE_LINE.findall(log.read_text(encoding="utf-8", errors="replace"))
    return None, stages[-1] if stages else "make"


def build_command(folder: Path, archive: Path) -> tuple[list[str], dict]:
    """``make all`` on the smoke config with distillation, every output under ``folder``."""
    data, reports = folder / "data", folder / "reports"
    command = [
        "make",
        "all",
        "CONFIG=configs/smoke.yaml",
        f"DATA={data}",
        f"REPORTS={reports}",
        f"SET=training.pseudo_labels=true paths.reports_dir={reports}",
    ]
    env = {
        **os.environ,
        "IMDB_ARCHIVE": str(archive),
        "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PIPELINE_QUIET": "1",
    }
    return command, env


def prepare_store(folder: Path) -> None:
    """The build's MLflow store with its experiment's artifacts under ``folder`` (not the checkout's ``mlruns/``)."""
    import mlflow

    folder.mkdir(parents=True, exist_ok=True)
    client = mlflow.tracking.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    if client.get_experiment_by_name(EXPERIMENT) is None:
        client.create_experiment(EXPERIMENT, artifact_location=(folder / "mlruns").as_uri())


def outcome(folder: Path) -> dict:
    """What a finished build left: registered versions and the alias, runs left RUNNING, temporary files."""
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    versions = client.search_model_versions(f"name = '{REGISTERED}'")
    champion = str(client.get_model_version_by_alias(REGISTERED, "champion").version) if versions else None
    experiment = client.get_experiment_by_name(EXPERIMENT)
    running = (
        client.search_runs([experiment.experiment_id], filter_string="attributes.status = 'RUNNING'")
        if experiment is not None
        else []
    )
    leftovers = [str(p.relative_to(folder)) for p in folder.rglob("*") if ".staging-" in p.name or p.suffix == ".tmp"]
    return {"versions": len(versions), "champion": champion, "running": len(running), "leftovers": leftovers}


def differences(reference: Path, rerun: Path) -> list[str]:
    """How ``rerun`` differs from ``reference`` (empty: the same)."""

    found = []
    one, two = (json.loads((side / "reports" / "comparison.json").read_text()) for side in (reference, rerun))
    ours, theirs = summary_figures(one), summary_figures(two)
    found += [f"comparison.json {name} differs" for name in ours if ours[name] != theirs.get(name)]
    folders, others = candidate_folders(reference), candidate_folders(rerun)
    for key, folder in folders.items():
        for file in sorted(folder.glob("*_predictions.parquet")):
            try:
                if largest_difference(pd.read_parquet(file), pd.read_parquet(others[key] / file.name), key):
                    found.append(f"{key} {file.name}: probabilities differ")
            except SystemExit as exc:  # another column (the predicted labels) differs
                found.append(f"{file.name} of {exc}")
    if (reference / "reports" / "example_scored.csv").read_bytes() != (
        rerun / "reports" / "example_scored.csv"
    ).read_bytes():
        found.append("the scored example differs")
    state = outcome(rerun)
    if state["versions"] != 1 or state["champion"] != "1":
        found.append(f"{state['versions']} registered versions, champion {state['champion']}")
    if state["running"]:
        found.append(f"{state['running']} run(s) left RUNNING")
    if state["leftovers"]:
        found.append(f"temporary files left: {state['leftovers'][:3]}")
    return found


def report(trials: list[dict], reference_seconds: float) -> str:
    tried, survived = Counter(t["stage"] for t in trials), Counter(t["stage"] for t in trials if not t["differences"])
    lines = [
        f"# Kills of `make all` (smoke config, distillation on; uninterrupted: {reference_seconds:.0f} s)",
        "",
        "| stage running when killed | kills | reruns that left the reference's outputs |",
        "| --- | --- | --- |",
        *[f"| {stage} | {tried[stage]} | {survived[stage]} |" for stage in sorted(tried)],
        f"| all | {len(trials)} | {sum(survived.values())} |",
    ]
    failed = [t for t in trials if t["differences"]]
    if failed:
        lines += [
            "",
            "Reruns that differed:",
            *[f"- kill at {t['at']:.1f} s ({t['stage']}): {t['differences']}" for t in failed],
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ignore_known_warnings()
    log_third_parties_to_file()  # MLflow's lines about creating each build's store go to the log file, not here
    generated = importlib.import_module("tests.conftest")  # the tests' generated reviews (not type-checked here)

    out = args.out.resolve()
    archive = out / "reviews.tar.gz"
    if not archive.is_file():
        generated.write_imdb_tree(out / "source", per_class={"train": 200, "test": 200}, seed=5, unlabeled=300)
        generated.make_archive(out / "source", archive)
    reference = out / "reference"
    done = out / "faults.json"
    if done.is_file():  # a run cut short goes on: its reference and the kills it finished are kept
        seconds = json.loads(done.read_text())["reference_seconds"]
    else:
        prepare_store(reference)
        command, env = build_command(reference, archive)
        started = time.perf_counter()
        status, _ = run(command, env, reference / "build.log")
        seconds = time.perf_counter() - started
        if status != 0:
            print(f"error: the reference build failed (see {reference / 'build.log'})", file=sys.stderr)
            return 1
        done.write_text(json.dumps({"reference_seconds": seconds, "trials": []}, indent=2))
    rng = random.Random(args.seed)
    trials = json.loads(done.read_text())["trials"]
    for index in range(args.kills):
        at = rng.uniform(0.02, 0.98) * seconds
        if index < len(trials):
            continue
        folder = out / f"kill-{index}"
        shutil.rmtree(folder, ignore_errors=True)
        prepare_store(folder)
        command, env = build_command(folder, archive)
        status, stage = run(command, env, folder / "build.log", kill_after=at)
        if status is not None:  # it finished before the moment: not a kill
            stage = "finished first"
        rerun, _ = run(command, env, folder / "build.log")
        found = differences(reference, folder) if rerun == 0 else [f"the rerun failed ({rerun})"]
        trials.append({"at": at, "stage": stage, "rerun_status": rerun, "differences": found})
        print(
            f"kill {index + 1}/{args.kills} at {at:.1f} s ({stage}): {'the same' if not found else found}", flush=True
        )
        done.write_text(json.dumps({"reference_seconds": seconds, "trials": trials}, indent=2))
    (out / "faults.md").write_text(report(trials, seconds))
    print(report(trials, seconds))
    return int(any(t["differences"] for t in trials))


if __name__ == "__main__":
    sys.exit(main())
