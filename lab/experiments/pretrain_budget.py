"""``make pretrain-budget``: test accuracy against minutes of masked-LM pretraining.

Reads:  ``data/tokenize/`` (and whatever the pretrain, train and evaluate stages read).
Writes: ``reports/pretraining_budget.{json,md,png}``: for a budget of 0 minutes (from scratch) and
        for each snapshot of one pretraining run (``pretrain.snapshot_minutes`` plus its full
        ``pretrain.max_minutes``), the classifier fine-tuned from it: best validation accuracy (the
        model is chosen on validation by early stopping) and test accuracy, each an MLflow run.

One pretraining run serves every budget (its snapshots), so the curve costs the largest budget
once plus one fine-tuning per point. Use ``--seeds`` for more than one fine-tuning seed per point.

Each encoder size (the ``model`` keys that shape the backbone) is one curve. Running the stage again
with another size adds its curve to the same report, as long as the tokenized data is the same; a
rerun with a size already in the report replaces that size's rows. The budget to use is read off
validation accuracy (never test): the report names, per size, the budget with the best mean.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from lab.experiments import parse_seeds
from pipeline.config import Config
from pipeline.core.catalog import BACKBONE_SNAPSHOTS_DIR, BACKBONE_SPEC_FILE, COMPARISON_REPORT, METRICS_FILE, stage_dir
from pipeline.core.errors import InputError
from pipeline.core.files import atomic_write_json, atomic_write_text, manifest_hash, require_manifest
from pipeline.stages.evaluate.scorecard import evaluate_run
from pipeline.stages.pretrain.masked_lm import pretrain
from pipeline.stages.train.fit_and_log import train_model

REPORT_NAME = "pretraining_budget"


def encoder_label(backbone: dict) -> str:
    """A short name for an encoder size, e.g. ``width 64, 1 block, 2 heads, ff 128``."""
    blocks = f"{backbone['num_layers']} block" + ("s" if backbone["num_layers"] != 1 else "")
    return f"width {backbone['hidden_dim']}, {blocks}, {backbone['num_heads']} heads, ff {backbone['intermediate_dim']}"


def summarize(rows: list[dict]) -> list[dict]:
    """Per encoder and budget: seeds, mean validation and test accuracy, the test spread, and test minus
    the same encoder's scratch runs on matched seeds (None when no seed matches)."""
    summary = []
    for encoder in dict.fromkeys(row["encoder"] for row in rows):
        mine = [row for row in rows if row["encoder"] == encoder]
        scratch = {row["seed"]: row["test_accuracy"] for row in mine if row["pretrain_minutes"] == 0}
        for minutes in sorted({row["pretrain_minutes"] for row in mine}):
            points = [row for row in mine if row["pretrain_minutes"] == minutes]
            test = np.array([row["test_accuracy"] for row in points])
            matched = [row["test_accuracy"] - scratch[row["seed"]] for row in points if row["seed"] in scratch]
            summary.append(
                {
                    "encoder": encoder,
                    "pretrain_minutes": minutes,
                    "seeds": len(points),
                    "mean_val_accuracy": float(np.mean([row["best_val_accuracy"] for row in points])),
                    "mean_test_accuracy": float(test.mean()),
                    "test_std": float(test.std(ddof=1)) if len(test) > 1 else None,
                    "test_minus_scratch": float(np.mean(matched)) if matched and minutes > 0 else None,
                }
            )
    return summary


def chosen_budgets(summary: list[dict]) -> dict[str, float]:
    """Per encoder, the budget with the best mean validation accuracy (the smaller budget on a tie)."""
    best: dict[str, dict] = {}
    for point in summary:
        current = best.get(point["encoder"])
        if current is None or point["mean_val_accuracy"] > current["mean_val_accuracy"]:
            best[point["encoder"]] = point
    return {encoder: point["pretrain_minutes"] for encoder, point in best.items()}


def plot_budget_curve(rows: list[dict], summary: list[dict], baseline: float | None, path: Path) -> Path:
    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure(7.5, 4.8)
    for index, encoder in enumerate(dict.fromkeys(row["encoder"] for row in rows)):
        color = f"C{index}"
        points = [point for point in summary if point["encoder"] == encoder]
        minutes = [point["pretrain_minutes"] for point in points]
        axis.plot(
            minutes,
            [point["mean_test_accuracy"] for point in points],
            marker="o",
            color=color,
            label=f"{encoder}: test",
        )
        axis.plot(
            minutes,
            [point["mean_val_accuracy"] for point in points],
            marker="s",
            color=color,
            linestyle=":",
            alpha=0.7,
            label=f"{encoder}: validation",
        )
        mine = [row for row in rows if row["encoder"] == encoder]
        axis.scatter(
            [row["pretrain_minutes"] for row in mine],
            [row["test_accuracy"] for row in mine],
            s=14,
            color=color,
            alpha=0.5,
        )
    if baseline is not None:
        axis.axhline(baseline, color="tab:gray", linestyle="--", label="lexical baseline (test)")
    axis.set(
        xlabel="masked-LM pretraining (minutes of training on this machine)",
        ylabel="accuracy",
        title="Accuracy against pretraining budget (lines: mean over seeds; dots: test, one per seed)",
    )
    axis.title.set_fontsize(9)
    axis.legend(fontsize=7)
    return save_figure(figure, path)


def merge_rows(previous: dict | None, tokenize_sha256: str, encoder: str, rows: list[dict]) -> tuple[list[dict], dict]:
    """This run's rows plus the other encoders' rows of a previous report over the same tokenized data."""
    if not previous or previous.get("tokenize_manifest_sha256") != tokenize_sha256:
        return rows, {}
    kept = [row for row in previous.get("rows", []) if row.get("encoder") not in (None, encoder)]
    runs = {name: run_id for name, run_id in previous.get("pretrain_runs", {}).items() if name != encoder}
    return kept + rows, runs


def read_previous_report(path: Path) -> dict | None:
    """The report an earlier run wrote (its other encoder sizes are kept); an unreadable one is an error,
    not something to overwrite."""
    if not path.is_file():
        return None
    try:
        previous = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a readable budget report ({error}); move it away to start a new one") from None
    if not isinstance(previous, dict):
        raise InputError(f"{path}: not a budget report (expected a JSON object); move it away to start a new one")
    return previous


def render_markdown(
    rows: list[dict], summary: list[dict], pretrain_runs: dict[str, str], baseline: float | None
) -> str:
    lines = [
        "# Test accuracy against pretraining budget",
        "",
        "Each point fine-tunes the classifier from a snapshot of one masked-LM pretraining run "
        "(0 minutes: from scratch); the model is chosen on validation, test is reported.",
        "",
    ]
    if baseline is not None:
        lines += [f"Lexical baseline (NBSVM; TF-IDF in reports before it), test accuracy: {baseline:.4f}", ""]
    lines += [
        "| encoder | pretraining minutes | seeds | mean validation accuracy | mean test accuracy | test std "
        "| test minus scratch (matched seeds) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for point in summary:
        std = "–" if point["test_std"] is None else f"{point['test_std']:.4f}"
        delta = "–" if point["test_minus_scratch"] is None else f"{100 * point['test_minus_scratch']:+.2f} points"
        lines.append(
            f"| {point['encoder']} | {point['pretrain_minutes']:g} | {point['seeds']} | "
            f"{point['mean_val_accuracy']:.4f} | {point['mean_test_accuracy']:.4f} | {std} | {delta} |"
        )
    lines += ["", "Budget with the best mean validation accuracy, per encoder:", ""]
    lines += [f"- {encoder}: **{minutes:g} minutes**" for encoder, minutes in chosen_budgets(summary).items()]
    lines += [
        "",
        "## Every run",
        "",
        "| encoder | pretraining minutes | seed | best validation accuracy | test accuracy | MLflow run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['encoder']} | {r['pretrain_minutes']:g} | {r['seed']} | {r['best_val_accuracy']:.4f} | "
        f"{r['test_accuracy']:.4f} | `{r['run_id']}` |"
        for r in rows
    ]
    lines += ["", "Pretraining runs: " + ", ".join(f"{name}: `{run_id}`" for name, run_id in pretrain_runs.items())]
    return "\n".join(lines) + "\n"


def comparison_baseline(reports_dir: Path) -> float | None:
    """The NBSVM baseline's test accuracy from ``make compare``'s report, when there is one (``baseline``: the
    TF-IDF one of reports written before NBSVM was the baseline)."""
    path = reports_dir / f"{COMPARISON_REPORT}.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text()).get("summary", {})
    baseline = summary.get("nbsvm") or summary.get("baseline")
    return None if baseline is None else float(baseline["test_accuracy"]["mean"])


def run(config: Config, seeds: tuple[int, ...] | None = None, baseline: float | None = None) -> Path:
    """The curve for the configured encoder size, fine-tuned with ``seeds`` (default ``compare.seeds``).

    ``baseline`` (the lexical baseline's test accuracy drawn on the plot) defaults to the previous budget report's
    over the same data, else ``reports/comparison.json``'s.
    """
    seeds = tuple(config.compare.seeds) if seeds is None else seeds
    started = time.perf_counter()
    reports = config.reports_dir
    json_file = reports / f"{REPORT_NAME}.json"
    previous = read_previous_report(json_file)  # before hours of work, not after
    out_dir = pretrain(config)
    # minutes of pretraining actually done (a snapshot is taken at the first period end after)
    snapshots: dict[float, Path | None] = {0.0: None}
    for folder in [out_dir, *sorted((out_dir / BACKBONE_SNAPSHOTS_DIR).glob("*min"))]:
        if (folder / BACKBONE_SPEC_FILE).is_file():
            snapshots[float(json.loads((folder / BACKBONE_SPEC_FILE).read_text())["train_minutes"])] = folder
    encoder = encoder_label(config.model.backbone())
    rows = []
    for minutes, snapshot in sorted(snapshots.items()):
        for seed in seeds:
            model = {"init": "scratch"} if snapshot is None else {"init": "pretrained", "pretrained": str(snapshot)}
            child = config.replace(model=model, training={"seed": seed})
            trained = train_model(child)
            run_id, run_dir = trained.logged_run_id(), trained.run_dir
            metrics = json.loads((evaluate_run(child, run=run_id).out_dir / METRICS_FILE).read_text())["metrics"]
            rows.append(
                {
                    "encoder": encoder,
                    "backbone": config.model.backbone(),
                    "pretrain_minutes": minutes,
                    "seed": seed,
                    "run_id": run_id,
                    "best_val_accuracy": require_manifest(run_dir)["best_val_accuracy"],
                    "test_accuracy": metrics["test_accuracy"],
                }
            )
    tokenize_sha256 = manifest_hash(stage_dir(config, "tokenize"))
    rows, pretrain_runs = merge_rows(previous, tokenize_sha256, encoder, rows)
    pretrain_runs[encoder] = require_manifest(out_dir)["mlflow_run_id"]
    if baseline is None and previous and previous.get("tokenize_manifest_sha256") == tokenize_sha256:
        baseline = previous.get("baseline_test_accuracy")
    if baseline is None:
        baseline = comparison_baseline(reports)
    summary = summarize(rows)
    payload = {
        "tokenize_manifest_sha256": tokenize_sha256,
        "rows": rows,
        "pretrain_runs": pretrain_runs,
        "summary": summary,
        "baseline_test_accuracy": baseline,
    }
    json_path = atomic_write_json(json_file, payload)
    md_path = atomic_write_text(reports / f"{REPORT_NAME}.md", render_markdown(rows, summary, pretrain_runs, baseline))
    png_path = plot_budget_curve(rows, summary, baseline, reports / f"{REPORT_NAME}.png")
    encoders = len(pretrain_runs)
    print(
        f"pretrain-budget: {len(seeds) * len(snapshots)} fine-tunings of {encoder} at {sorted(snapshots)} minutes of "
        f"pretraining ({len(rows)} rows, {encoders} encoder size{'s' if encoders != 1 else ''} in the report); "
        f"wrote {md_path}, {json_path.name}, {png_path.name} in {time.perf_counter() - started:.0f}s"
    )
    return md_path


def main(config: Config, args) -> None:
    run(config, parse_seeds(args.seeds), args.baseline)
