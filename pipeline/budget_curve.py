"""Experiment stage (``make pretrain-budget``): test accuracy against minutes of masked-LM pretraining.

Reads:  ``data/tokenize/`` (and whatever the pretrain, train and evaluate stages read).
Writes: ``reports/pretraining_budget.{json,md,png}``: for a budget of 0 minutes (from scratch) and
        for each snapshot of one pretraining run (``pretrain.snapshot_minutes`` plus its full
        ``pretrain.max_minutes``), the classifier fine-tuned from it: best validation accuracy (the
        model is chosen on validation by early stopping) and test accuracy, each an MLflow run.

One pretraining run serves every budget (its snapshots), so the curve costs the largest budget
once plus one fine-tuning per point. Use ``--seeds`` for more than one fine-tuning seed per point.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from pipeline.artifacts import atomic_write_json, atomic_write_text, read_manifest
from pipeline.config import Config
from pipeline.stages import stage_dir


def plot_budget_curve(rows: list[dict], baseline: float | None, path: Path) -> Path:
    from pipeline.plots import new_figure, save_figure

    figure, axis = new_figure(7, 4.5)
    minutes = sorted({row["pretrain_minutes"] for row in rows})
    for key, label, marker in (("test_accuracy", "test accuracy", "o"), ("best_val_accuracy", "validation accuracy", "s")):
        means = [np.mean([r[key] for r in rows if r["pretrain_minutes"] == m]) for m in minutes]
        axis.plot(minutes, means, marker=marker, label=label)
        axis.scatter([r["pretrain_minutes"] for r in rows], [r[key] for r in rows], s=12, alpha=0.5)
    if baseline is not None:
        axis.axhline(baseline, color="tab:gray", linestyle="--", label="TF-IDF + logistic regression (test)")
    axis.set(xlabel="masked-LM pretraining (minutes of training on this machine)", ylabel="accuracy",
             title="Accuracy against pretraining budget")
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def run(config: Config, seeds: tuple[int, ...] = (42,), baseline: float | None = None) -> Path:
    from pipeline import evaluate, pretrain, train

    started = time.perf_counter()
    out_dir = pretrain.run(config)
    snapshots = {0.0: None}  # minutes of pretraining actually done (a snapshot is taken at the first period end after)
    for folder in [out_dir, *sorted((out_dir / pretrain.SNAPSHOT_DIR).glob("*min"))]:
        if (folder / pretrain.SPEC_FILE).is_file():
            snapshots[float(json.loads((folder / pretrain.SPEC_FILE).read_text())["train_minutes"])] = folder
    rows = []
    for minutes, folder in sorted(snapshots.items()):
        for seed in seeds:
            model = {"init": "scratch"} if folder is None else {"init": "pretrained", "pretrained": str(folder)}
            child = config.replace(model=model, training={"seed": seed})
            run_dir = train.run(child)
            run_id = read_manifest(run_dir)["mlflow_run_id"]
            metrics = json.loads((evaluate.run(child, run=run_id) / "metrics.json").read_text())["metrics"]
            rows.append({"pretrain_minutes": minutes, "seed": seed, "run_id": run_id,
                         "best_val_accuracy": read_manifest(run_dir)["best_val_accuracy"],
                         "test_accuracy": metrics["test_accuracy"]})
    reports = config.reports_dir
    payload = {"rows": rows, "pretrain_run_id": read_manifest(stage_dir(config, "pretrain"))["mlflow_run_id"],
               "baseline_test_accuracy": baseline}
    json_path = atomic_write_json(reports / "pretraining_budget.json", payload)
    lines = ["# Test accuracy against pretraining budget", "",
             "| pretraining minutes | seed | best validation accuracy | test accuracy | MLflow run |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['pretrain_minutes']:g} | {r['seed']} | {r['best_val_accuracy']:.4f} | {r['test_accuracy']:.4f} | "
              f"`{r['run_id']}` |" for r in rows]
    md_path = atomic_write_text(reports / "pretraining_budget.md", "\n".join(lines) + "\n")
    png_path = plot_budget_curve(rows, baseline, reports / "pretraining_budget.png")
    print(f"pretrain-budget: {len(rows)} fine-tunings at {sorted(snapshots)} minutes of pretraining; wrote {md_path}, "
          f"{json_path.name}, {png_path.name} in {time.perf_counter() - started:.0f}s")
    return md_path


def main(config: Config, args) -> None:
    from pipeline.errors import ConfigError

    try:
        seeds = tuple(int(seed) for seed in args.seeds.split(","))
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    run(config, seeds, args.baseline)
