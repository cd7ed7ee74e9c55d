"""A same-machine A/B for a change that must change no number: build, then compare two checkouts' stored predictions.

``build CHECKOUT OUT`` writes generated reviews (``tests.conftest.write_imdb_tree``: 300 per class and split, 400
unlabeled, seed 3) and runs ``python -m pipeline ingest``, ``tokenize``, ``compare`` and ``register`` from CHECKOUT with
``configs/smoke.yaml`` and distillation on (``training.pseudo_labels=true``), every output under OUT (its data, reports
and MLflow store), then scores the generated test reviews with the registered champion and with every candidate's
logged model.

``diff OUT_A OUT_B`` pairs every stored ``*_predictions.parquet`` by its path under ``data/`` and every scored CSV, and
prints the largest difference of any float column (non-float columns must be equal) and whether each test and
validation figure of ``comparison.json`` is equal. It exits 1 on any difference.

    python -m lab.audits.refactor_check build /work/base /tmp/ab/before   # a checkout of the commit before
    python -m lab.audits.refactor_check build . /tmp/ab/after
    python -m lab.audits.refactor_check diff /tmp/ab/before /tmp/ab/after
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core.logs import ignore_known_warnings

SETTINGS = ["--set", "training.pseudo_labels=true"]


def build(checkout: Path, out: Path) -> None:
    from pipeline.model import kinds  # MLflow, imported once its known warnings are filtered

    out.mkdir(parents=True, exist_ok=True)
    write_imdb_tree = importlib.import_module("tests.conftest").write_imdb_tree  # the tests' generated reviews

    root = out / "raw"
    if not root.exists():
        write_imdb_tree(root, per_class={"train": 300, "test": 300}, seed=3, unlabeled=400)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "IMDB_ARCHIVE": str(root / "aclImdb"),
        "PIPELINE_QUIET": "1",
    }
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])  # the runs' artifacts under OUT, not the checkout's mlruns/
    if mlflow.get_experiment_by_name("smoke") is None:
        mlflow.create_experiment("smoke", artifact_location=(out / "mlruns").as_uri())
    common = ["--config", "configs/smoke.yaml", "--set", f"paths.data_dir={out / 'data'}"]
    common += ["--set", f"paths.reports_dir={out / 'reports'}", *SETTINGS]
    for stage in (["ingest"], ["tokenize"], ["compare", "--design", "main"], ["register"]):
        subprocess.run([sys.executable, "-m", "pipeline", *stage, *common], cwd=checkout, env=env, check=True)
    test = pd.read_parquet(out / "data" / "ingest" / "test.parquet")[["text"]]
    test.to_csv(out / "test_texts.csv", index=False)
    comparison = json.loads((out / "reports" / "comparison.json").read_text())
    models = {"champion": "models:/smoke-sentiment@champion"}
    for name, entry in comparison["summary"].items():
        if kinds.kind_of(entry["kind"]).deployable and entry.get("run_ids"):  # the reference row logs no model
            models[name] = f"runs:/{entry['run_ids'][0]}/model"
    for name, uri in models.items():
        target = out / "scored" / f"{name.replace('+', '_')}.csv"
        target.parent.mkdir(exist_ok=True)
        command = ["score", "--input", str(out / "test_texts.csv"), "--output", str(target), "--model", uri]
        subprocess.run([sys.executable, "-m", "pipeline", *command, *common], cwd=checkout, env=env, check=True)


def largest_difference(a: pd.DataFrame, b: pd.DataFrame, name: str) -> float:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        raise SystemExit(f"{name}: columns or rows differ: {list(a.columns)} {len(a)} / {list(b.columns)} {len(b)}")
    worst = 0.0
    for column in a.columns:
        if pd.api.types.is_float_dtype(a[column]):
            worst = max(worst, float(np.nanmax(np.abs(a[column].to_numpy() - b[column].to_numpy()), initial=0.0)))
        elif not a[column].equals(b[column]):
            raise SystemExit(f"{name}: column {column} differs")
    return worst


def candidate_folders(side: Path) -> dict[str, Path]:
    """Each candidate's stored-predictions folder under ``reports/``, keyed by candidate and seed (run ids and
    compare keys differ between two builds): a Transformer's is its run id, a fusion's names its Transformer's run."""
    from pipeline.model import kinds  # MLflow, imported once its known warnings are filtered

    summary = json.loads((side / "reports" / "comparison.json").read_text())["summary"]
    folders: dict[str, Path] = {}
    for name, entry in summary.items():
        if kinds.kind_of(entry["kind"]).varies_pooling:  # a Transformer: a run per seed, each fused with NBSVM
            for seed, run_id in enumerate(entry["run_ids"]):
                folders[f"{name} seed {seed}"] = side / "reports" / run_id
                (fused,) = (side / "reports").glob(f"fusion-{run_id}-*")
                folders[f"nbsvm+{name} seed {seed}"] = fused
    for baseline in ("nbsvm", "tfidf"):
        (folders[baseline],) = (side / "reports").glob(f"baseline-{baseline}-*")
    return folders


def summary_figures(payload: dict) -> dict[str, dict]:
    """Each candidate's figures in a ``comparison.json``: what two builds of the same code must share (not their run
    ids, not their seconds)."""
    return {
        name: {key: value for key, value in entry.items() if "seconds" not in key and key != "run_ids"}
        for name, entry in payload["summary"].items()
    }


def diff(before: Path, after: Path) -> int:
    one_side, other_side = candidate_folders(before), candidate_folders(after)
    pairs = [
        (f"{key}: {p.name}", p, other_side[key] / p.name)
        for key, folder in sorted(one_side.items())
        for p in sorted(folder.glob("*_predictions.parquet"))
    ]
    pairs += [(p.name, p, after / "scored" / p.name) for p in sorted(before.glob("scored/*.csv"))]
    files = [name for name, _, _ in pairs]
    worst, rows = 0.0, 0
    for name, this, other in pairs:
        if not other.exists():
            print(f"missing after: {other}")
            return 1
        read = pd.read_parquet if this.suffix == ".parquet" else pd.read_csv
        a, b = read(this), read(other)
        difference = largest_difference(a, b, name)
        rows += len(a)
        worst = max(worst, difference)
        if difference:
            print(f"{name}: largest difference {difference}")
    one, two = (json.loads((side / "reports" / "comparison.json").read_text()) for side in (before, after))
    figures, others = summary_figures(one), summary_figures(two)
    print(f"{len(files)} files, {rows} rows: largest difference of any probability {worst}")
    for name in sorted(set(figures) | set(others)):
        for key in sorted(set(figures.get(name, {})) | set(others.get(name, {}))):
            if figures.get(name, {}).get(key) != others.get(name, {}).get(key):
                print(
                    f"comparison.json {name} {key}: {figures.get(name, {}).get(key)} / {others.get(name, {}).get(key)}"
                )
    print(
        f"comparison.json figures equal: {figures == others}; recommendation "
        f"{one.get('recommendation', {}).get('variant')} / {two.get('recommendation', {}).get('variant')}"
    )
    return int(worst != 0.0 or figures != others)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("build")
    one.add_argument("checkout", type=Path)
    one.add_argument("out", type=Path)
    two = commands.add_parser("diff")
    two.add_argument("before", type=Path)
    two.add_argument("after", type=Path)
    args = parser.parse_args()
    ignore_known_warnings()  # MLflow's notice about our pyfunc models' type hints, on import
    if args.command == "build":
        build(args.checkout.resolve(), args.out.resolve())
        return 0
    return diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
