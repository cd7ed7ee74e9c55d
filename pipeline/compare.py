"""Comparison stage: does first-token pooling beat masked mean pooling? (or: is position worth it?)

Reads:  ``data/tokenize/`` and ``data/ingest/`` (through the train and evaluate stages).
Writes: one MLflow parent run with a child run per (variant, seed) plus a TF-IDF + logistic
        regression baseline child; ``reports/comparison.{md,json,png}`` (``reports/ablation_position.*``
        for ``--factor position``), also logged to the parent run.

Every variant uses the same data, tokenizer, hyper-parameters and budget; only the factor
and the seed change. Seeds are matched across variants, so McNemar's test compares
predictions of models trained with the same seed on the same test reviews, and the paired
bootstrap resamples test reviews jointly for all of them. Finished children are reused, so
re-running after a crash continues where it stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from pipeline.artifacts import atomic_write_json, atomic_write_text, manifest_hash, read_manifest
from pipeline.config import FACTORS, Config
from pipeline.errors import InputError
from pipeline.metrics import classification_metrics, mcnemar_exact, paired_bootstrap_difference
from pipeline.stages import require_output
from pipeline.text import load_labels
from pipeline.tracking import (
    adopt_child,
    baseline_tags,
    comparison_tags,
    find_baseline_run,
    find_comparison_run_id,
    flat_params,
    set_members,
    setup_tracking,
)

SIGNIFICANCE_LEVEL = 0.05
SUMMARY_METRICS = ("test_accuracy", "test_f1", "test_roc_auc", "test_log_loss", "test_ece", "best_val_accuracy",
                   "train_seconds")


# --------------------------------------------------------------------------- pure functions


def variant_config(config: Config, factor: str, value: str, seed: int) -> Config:
    return config.replace(model={factor: value}, training={"seed": seed})


def mean_std(values: list[float]) -> dict[str, float | list[float]]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
            "values": [float(v) for v in array]}


def summarize_variants(children: list[dict]) -> dict[str, dict]:
    """Per variant: seeds, run ids and mean/std of every summary metric present."""
    summary: dict[str, dict] = {}
    for child in children:
        entry = summary.setdefault(child["variant"], {"seeds": [], "run_ids": [], "_metrics": {}})
        entry["seeds"].append(child["seed"])
        entry["run_ids"].append(child["run_id"])
        for key, value in child["metrics"].items():
            entry["_metrics"].setdefault(key, []).append(value)
    for entry in summary.values():
        for key, values in entry.pop("_metrics").items():
            entry[key] = mean_std(values)
    return summary


def compare_pair(correct_a: np.ndarray, correct_b: np.ndarray, seeds: list[int], samples: int) -> dict:
    """Accuracy difference A - B: seed-matched McNemar tests and a paired bootstrap CI."""
    per_seed = [{"seed": seed, **mcnemar_exact(a, b), "accuracy_difference": float(a.mean() - b.mean())}
                for seed, a, b in zip(seeds, correct_a, correct_b)]
    bootstrap = paired_bootstrap_difference(correct_a, correct_b, samples=samples, seed=0)
    ci_excludes_zero = bootstrap["ci_low"] > 0 or bootstrap["ci_high"] < 0
    all_seeds_significant = all(s["p_value"] < SIGNIFICANCE_LEVEL for s in per_seed)
    same_sign = len({np.sign(s["accuracy_difference"]) for s in per_seed}) == 1
    return {
        "mean_accuracy_difference": bootstrap["difference"],
        "bootstrap": bootstrap,
        "mcnemar": per_seed,
        "significant": bool(ci_excludes_zero and all_seeds_significant and same_sign),
        "criterion": (f"significant when the paired bootstrap {int(100 * 0.95)}% CI excludes 0, every seed-matched "
                      f"McNemar test has p < {SIGNIFICANCE_LEVEL}, and all seeds agree on the sign"),
    }


def verdict(factor: str, a: str, b: str, pair: dict, n_seeds: int, n_test: int) -> str:
    difference = pair["mean_accuracy_difference"]
    boot = pair["bootstrap"]
    p_values = ", ".join(f"{s['p_value']:.3g}" for s in pair["mcnemar"])
    better, worse = (a, b) if difference > 0 else (b, a)
    evidence = (f"Over {n_seeds} seed-matched pairs on {n_test:,} test reviews, {a} minus {b} test accuracy is "
                f"{difference * 100:+.2f} points (paired bootstrap 95% CI {boot['ci_low'] * 100:+.2f} to "
                f"{boot['ci_high'] * 100:+.2f}; McNemar p per seed: {p_values}).")
    if pair["significant"]:
        conclusion = (f" The difference is statistically significant: {better} {factor} beats {worse} on this test "
                      f"set under this budget. The CI covers test-set sampling for these {n_seeds} seeds, not other "
                      "datasets, model sizes or training budgets.")
    else:
        conclusion = (f" The difference is not statistically significant by the criterion above, so these runs do "
                      f"not show that either {factor} is better on this task at this budget; they do not show the two "
                      "are equivalent either.")
    return evidence + conclusion


def correctness(predictions: pd.DataFrame) -> np.ndarray:
    return predictions["correct"].to_numpy(dtype=bool)


# --------------------------------------------------------------------------- baseline


def tfidf_baseline(train: pd.DataFrame, test: pd.DataFrame, seed: int) -> np.ndarray:
    """TF-IDF (1-2 grams) + logistic regression on the train split; test probabilities ``[N, k]``."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, max_features=300_000, sublinear_tf=True),
        LogisticRegression(C=4.0, max_iter=2000, random_state=seed),
    )
    model.fit(train["text"], train["label"])
    return model.predict_proba(test["text"])  # [N, k] in class-index order, like the Transformer's


def run_baseline(config: Config, key: str, force: bool = False) -> dict:
    """Train/evaluate the baseline as a child run, or reuse a finished one with the same key."""
    existing = None if force else find_baseline_run(config, key)
    out_dir = config.reports_dir / f"baseline-{key}"
    predictions_path = out_dir / "test_predictions.parquet"
    if existing is not None and predictions_path.is_file():
        return {"variant": "baseline", "seed": None, "run_id": existing.info.run_id,
                "predictions": pd.read_parquet(predictions_path),
                "metrics": {k: v for k, v in existing.data.metrics.items() if k in SUMMARY_METRICS}}
    from pipeline.evaluate import prediction_frame

    ingest_dir = require_output(config, "ingest")
    train = pd.read_parquet(ingest_dir / "train.parquet")
    test = pd.read_parquet(ingest_dir / "test.parquet")
    names = load_labels(ingest_dir)
    with mlflow.start_run(run_name="baseline-tfidf-logreg", nested=True) as child:
        started = time.perf_counter()
        probabilities = tfidf_baseline(train, test, seed=config.data.seed)
        seconds = time.perf_counter() - started
        metrics = {f"test_{k}": v for k, v in classification_metrics(test["label"].to_numpy(), probabilities,
                                                                      names).items()}
        metrics["train_seconds"] = seconds
        mlflow.log_params({"model": "tfidf-1-2gram+logistic-regression", "tfidf.ngram_range": "1,2",
                           "tfidf.min_df": 2, "logreg.C": 4.0})
        mlflow.set_tags(baseline_tags(key))
        mlflow.log_metrics(metrics)
        predictions = prediction_frame(test["source_file"], test["label"].to_numpy(), probabilities, names)
        out_dir.mkdir(parents=True, exist_ok=True)
        predictions.to_parquet(predictions_path, index=False)
        run_id = child.info.run_id
    print(f"compare: baseline test_accuracy {metrics['test_accuracy']:.4f} ({seconds:.0f}s)")
    return {"variant": "baseline", "seed": None, "run_id": run_id, "predictions": predictions,
            "metrics": {k: v for k, v in metrics.items() if k in SUMMARY_METRICS}}


# --------------------------------------------------------------------------- reports


def plot_comparison(summary: dict, factor: str, variants: tuple[str, str], pair: dict, path: Path) -> Path:
    from pipeline.plots import new_figure, save_figure

    figure, (accuracy_axis, difference_axis) = new_figure(width=11, height=4.2, ncols=2)
    for x, name in enumerate(variants):
        values = summary[name]["test_accuracy"]["values"]
        accuracy_axis.scatter([x] * len(values), values, color="tab:blue", zorder=3, label="one seed" if x == 0 else None)
        accuracy_axis.errorbar(x + 0.1, summary[name]["test_accuracy"]["mean"], yerr=summary[name]["test_accuracy"]["std"],
                               fmt="s", color="black", capsize=4, label="mean ± std" if x == 0 else None)
    if "baseline" in summary:
        accuracy_axis.axhline(summary["baseline"]["test_accuracy"]["mean"], color="tab:gray", linestyle="--",
                              label="TF-IDF + logistic regression")
    accuracy_axis.set_xticks(range(len(variants)), variants)
    accuracy_axis.set(ylabel="test accuracy", title=f"Test accuracy by {factor}")
    accuracy_axis.legend(fontsize=8)

    seeds = [s["seed"] for s in pair["mcnemar"]]
    differences = [100 * s["accuracy_difference"] for s in pair["mcnemar"]]
    difference_axis.bar([str(s) for s in seeds], differences, color="tab:blue")
    boot = pair["bootstrap"]
    difference_axis.axhspan(100 * boot["ci_low"], 100 * boot["ci_high"], color="tab:orange", alpha=0.25,
                            label="paired bootstrap 95% CI of the mean")
    difference_axis.axhline(0, color="black", linewidth=0.8)
    difference_axis.set(xlabel="seed", ylabel=f"{variants[0]} - {variants[1]} (accuracy points)",
                        title="Seed-matched difference")
    difference_axis.legend(fontsize=8)
    return save_figure(figure, path)


def markdown_report(payload: dict) -> str:
    factor, (a, b) = payload["factor"], payload["variants"]
    lines = [f"# {factor.capitalize()} comparison: {a} vs {b}", "",
             f"MLflow parent run `{payload['parent_run_id']}`; seeds {payload['seeds']}; "
             f"{payload['test_rows']:,} test reviews; identical data, tokenizer, hyper-parameters and budget apart "
             f"from `{factor}`.", "",
             "| variant | runs | test accuracy | test F1 | test ROC AUC | test log loss | test ECE | best val accuracy | train seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in (a, b, "baseline"):
        entry = payload["summary"].get(name)
        if entry is None:
            continue
        cells = []
        for key in SUMMARY_METRICS:
            stat = entry.get(key)
            cells.append("–" if stat is None else (f"{stat['mean']:.4f} ± {stat['std']:.4f}" if key != "train_seconds"
                                                   else f"{stat['mean']:.0f} ± {stat['std']:.0f}"))
        label = "TF-IDF + logistic regression (baseline)" if name == "baseline" else f"`{name}`"
        lines.append(f"| {label} | {len(entry['run_ids'])} | " + " | ".join(cells) + " |")
    pair = payload["difference"]
    boot = pair["bootstrap"]
    lines += ["", "## Difference", "",
              f"- mean accuracy difference ({a} - {b}): {pair['mean_accuracy_difference'] * 100:+.2f} points",
              f"- paired bootstrap 95% CI ({boot['samples']} resamples of test reviews): "
              f"[{boot['ci_low'] * 100:+.2f}, {boot['ci_high'] * 100:+.2f}] points"]
    for s in pair["mcnemar"]:
        lines.append(f"- seed {s['seed']}: difference {s['accuracy_difference'] * 100:+.2f} points; McNemar exact "
                     f"p = {s['p_value']:.3g} (only {a} right: {s['only_a_correct']}, only {b} right: {s['only_b_correct']})")
    lines += [f"- criterion: {pair['criterion']}", "", "## Verdict", "", payload["verdict"], ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- stage entry point


def comparison_key(config: Config, factor: str) -> str:
    tokenize_hash = manifest_hash(require_output(config, "tokenize"))[:8]
    return f"{factor}-{config.section_hash('model', 'training', 'compare')[:8]}-{tokenize_hash}"


def train_and_evaluate(config: Config, factor: str, value: str, seed: int, parent_id: str, force: bool) -> dict:
    from pipeline import evaluate, train

    child_config = variant_config(config, factor, value, seed)
    run_dir = train.run(child_config, force=force)
    run_id = read_manifest(run_dir)["mlflow_run_id"]
    adopt_child(run_id, parent_id)
    predictions_path = evaluate.run(child_config, run=run_id, force=force) / "test_predictions.parquet"
    client = mlflow.tracking.MlflowClient()
    metrics = {k: v for k, v in client.get_run(run_id).data.metrics.items() if k in SUMMARY_METRICS}
    return {"variant": value, "seed": seed, "run_id": run_id, "metrics": metrics,
            "predictions": pd.read_parquet(predictions_path)}


def run(config: Config, factor: str = "pooling", force: bool = False) -> Path:
    """Train and evaluate every (variant, seed), the baseline, and write the comparison report.

    Finished children are reused; ``force`` retrains and re-evaluates every one of them.
    """
    started = time.perf_counter()
    require_output(config, "tokenize")
    variants = FACTORS[factor].values
    seeds = list(config.compare.seeds)
    setup_tracking(config)
    key = comparison_key(config, factor)
    parent_id = find_comparison_run_id(config, key)
    with mlflow.start_run(run_id=parent_id, run_name=None if parent_id else f"compare-{factor}") as parent:
        parent_id = parent.info.run_id
        mlflow.set_tags(comparison_tags(key, factor, variants, seeds))
        if not parent.data.params:
            mlflow.log_params({k: v for k, v in flat_params(config).items() if k != f"model.{factor}"})
        children = [train_and_evaluate(config, factor, value, seed, parent_id, force)
                    for value in variants for seed in seeds]
        baseline = run_baseline(config, key, force)
        set_members([child["run_id"] for child in children])

        order = children[0]["predictions"]["source_file"]
        for child in children[1:] + [baseline]:
            if not child["predictions"]["source_file"].equals(order):
                raise InputError(f"run {child['run_id']} was evaluated on different test rows; rerun `make evaluate`")
        correct = {value: np.stack([correctness(c["predictions"]) for c in children if c["variant"] == value])
                   for value in variants}
        pair = compare_pair(correct[variants[0]], correct[variants[1]], seeds, config.compare.bootstrap_samples)
        summary = summarize_variants(children + [baseline])
        payload = {"factor": factor, "variants": list(variants), "seeds": seeds, "parent_run_id": parent_id,
                   "test_rows": int(len(order)), "summary": summary, "difference": pair,
                   "verdict": verdict(factor, variants[0], variants[1], pair, len(seeds), len(order))}

        name = FACTORS[factor].report_name
        reports = config.reports_dir
        json_path = atomic_write_json(reports / f"{name}.json", payload)
        md_path = atomic_write_text(reports / f"{name}.md", markdown_report(payload))
        png_path = plot_comparison(summary, factor, variants, pair, reports / f"{name}.png")
        for path in (json_path, md_path, png_path):
            mlflow.log_artifact(str(path), "comparison")
        mlflow.log_metrics({"mean_accuracy_difference": pair["mean_accuracy_difference"],
                            "bootstrap_ci_low": pair["bootstrap"]["ci_low"],
                            "bootstrap_ci_high": pair["bootstrap"]["ci_high"],
                            "significant": float(pair["significant"])})
    print(f"compare: {len(children)} runs + baseline on {len(order):,} test reviews; {variants[0]} - {variants[1]} "
          f"= {pair['mean_accuracy_difference'] * 100:+.2f} points ({'significant' if pair['significant'] else 'not significant'}); "
          f"wrote {md_path}, {json_path.name}, {png_path.name} in {time.perf_counter() - started:.0f}s")
    return md_path


def main(config: Config, args) -> None:
    run(config, factor=args.factor, force=args.force)
