"""Comparison stage: first-token vs mean pooling, from scratch and pretrained (2 x 2), or one ablation.

Reads:  ``data/tokenize/`` and ``data/ingest/`` (through the pretrain, train and evaluate stages).
Writes: one MLflow parent run with a child run per (variant, seed) plus a TF-IDF + logistic
        regression baseline child; ``reports/comparison.{md,json,png}`` (``reports/ablation_position.*``
        for ``--factor position``), also logged to the parent run.

Every variant uses the same data, tokenizer, hyper-parameters and budget; only the design's
factors and the seed change. Seeds are matched across variants, so McNemar's test compares
predictions of models trained with the same seed on the same test reviews, and the paired
bootstrap resamples test reviews jointly for all of them. For two factors the report gives
both main effects (each averaged over the other factor's levels) and their interaction.
Finished children are reused, so re-running after a crash continues where it stopped.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from pipeline import behaviour
from pipeline.artifacts import atomic_write_json, atomic_write_text, manifest_hash, read_manifest
from pipeline.baseline import tfidf_baseline
from pipeline.config import DESIGNS, Config, Design
from pipeline.errors import InputError
from pipeline.metrics import classification_metrics, mcnemar_exact, paired_bootstrap_difference
from pipeline.stages import require_output
from pipeline.text import load_labels
from pipeline.tracking import (
    adopt_child,
    baseline_tags,
    comparison_tags,
    describe_run,
    find_baseline_run,
    find_comparison_run_id,
    flat_params,
    set_members,
    setup_tracking,
)

SIGNIFICANCE_LEVEL = 0.05
SUMMARY_METRICS = ("test_accuracy", "test_f1", "test_roc_auc", "test_log_loss", "test_ece", "best_val_accuracy",
                   "train_seconds")


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a comparison reports: ``SUMMARY_METRICS`` and the behaviour pass rates."""
    return {k: v for k, v in metrics.items() if k in SUMMARY_METRICS or behaviour.capability_of(k)}


# --------------------------------------------------------------------------- pure functions


def variants(design: Design) -> list[dict[str, str]]:
    """Every combination of the design's factor values, A levels first."""
    keys = [key for key, _ in design.factors]
    return [dict(zip(keys, values)) for values in itertools.product(*(levels for _, levels in design.factors))]


def variant_name(variant: dict[str, str]) -> str:
    """``first_token/pretrained`` for two factors; the bare value (``learned``) for one."""
    return "/".join(variant.values())


def variant_config(config: Config, variant: dict[str, str], seed: int) -> Config:
    return config.replace(model=variant, training={"seed": seed})


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


def compare_pair(correct_a: np.ndarray, correct_b: np.ndarray, labels: list[dict], samples: int) -> dict:
    """Accuracy difference A - B over matched rows (one per seed, or per seed and other-factor level):
    a McNemar test per matched pair and a paired bootstrap CI of the mean difference."""
    per_pair = [{**label, **mcnemar_exact(a, b), "accuracy_difference": float(a.mean() - b.mean())}
                for label, a, b in zip(labels, correct_a, correct_b)]
    bootstrap = paired_bootstrap_difference(correct_a, correct_b, samples=samples, seed=0)
    ci_excludes_zero = bootstrap["ci_low"] > 0 or bootstrap["ci_high"] < 0
    all_pairs_significant = all(s["p_value"] < SIGNIFICANCE_LEVEL for s in per_pair)
    same_sign = len({np.sign(s["accuracy_difference"]) for s in per_pair}) == 1
    return {
        "mean_accuracy_difference": bootstrap["difference"],
        "bootstrap": bootstrap,
        "mcnemar": per_pair,
        "significant": bool(ci_excludes_zero and all_pairs_significant and same_sign),
        "criterion": (f"significant when the paired bootstrap {int(100 * 0.95)}% CI excludes 0, every seed-matched "
                      f"McNemar test has p < {SIGNIFICANCE_LEVEL}, and all pairs agree on the sign"),
    }


def main_effect(design: Design, index: int, correct: dict[str, np.ndarray], seeds: list[int], samples: int) -> dict:
    """Factor ``index``'s A - B accuracy difference, matched on seed and on every other factor's level."""
    key, (a, b) = design.factors[index]
    rows_a, rows_b, labels = [], [], []
    for variant in variants(design):
        if variant[key] != a:
            continue
        other = {k: v for k, v in variant.items() if k != key}
        partner = variant_name({**variant, key: b})
        for row, seed in enumerate(seeds):
            rows_a.append(correct[variant_name(variant)][row])
            rows_b.append(correct[partner][row])
            labels.append({"seed": seed, **({"at": ", ".join(f"{k}={v}" for k, v in other.items())} if other else {})})
    return {"factor": key, "a": a, "b": b, **compare_pair(np.stack(rows_a), np.stack(rows_b), labels, samples)}


def interaction(design: Design, correct: dict[str, np.ndarray], samples: int) -> dict:
    """For two factors: (A1 - B1 at the second factor's A2) minus (A1 - B1 at its B2), with a paired bootstrap CI."""
    (key1, (a1, b1)), (key2, (a2, b2)) = design.factors
    name = lambda v1, v2: variant_name({key1: v1, key2: v2})  # noqa: E731
    plus = correct[name(a1, a2)].astype(float) + correct[name(b1, b2)]
    minus = correct[name(b1, a2)].astype(float) + correct[name(a1, b2)]
    bootstrap = paired_bootstrap_difference(plus, minus, samples=samples, seed=0)
    return {"description": f"({key1} {a1} - {b1}) with {key2}={a2} minus the same with {key2}={b2}",
            "difference": bootstrap["difference"], "bootstrap": bootstrap,
            "significant": bool(bootstrap["ci_low"] > 0 or bootstrap["ci_high"] < 0)}


def effect_sentence(effect: dict, n_test: int) -> str:
    difference, boot = effect["mean_accuracy_difference"], effect["bootstrap"]
    a, b, factor = effect["a"], effect["b"], effect["factor"]
    p_values = ", ".join(f"{s['p_value']:.3g}" for s in effect["mcnemar"])
    better, worse = (a, b) if difference > 0 else (b, a)
    evidence = (f"{factor}: {a} minus {b} test accuracy is {difference * 100:+.2f} points over "
                f"{len(effect['mcnemar'])} matched pairs on {n_test:,} test reviews (paired bootstrap 95% CI "
                f"{boot['ci_low'] * 100:+.2f} to {boot['ci_high'] * 100:+.2f}; McNemar p per pair: {p_values}).")
    if effect["significant"]:
        return evidence + (f" The difference is statistically significant: {better} beats {worse} on this test set under this budget "
                           "(the CI covers test-set sampling for these seeds, not other datasets, sizes or budgets).")
    return evidence + (f" The difference is not statistically significant by the criterion: these runs do not show that either {factor} "
                       "is better at this budget; they do not show the two are equivalent either.")


def recommendation(summary: dict, names: list[str]) -> dict:
    """The variant to deploy: the highest mean validation accuracy (never test), as `make register` chooses."""
    best = max(names, key=lambda name: summary[name]["best_val_accuracy"]["mean"])
    entry = {"variant": best, "best_val_accuracy": summary[best]["best_val_accuracy"]["mean"],
             "test_accuracy": summary[best]["test_accuracy"]["mean"]}
    if "baseline" in summary:
        entry["baseline_test_accuracy"] = summary["baseline"]["test_accuracy"]["mean"]
    return entry


def verdict(payload: dict) -> str:
    sentences = [effect_sentence(effect, payload["test_rows"]) for effect in payload["effects"].values()]
    if payload.get("interaction"):
        inter = payload["interaction"]
        boot = inter["bootstrap"]
        sentences.append(f"Interaction, {inter['description']}: {inter['difference'] * 100:+.2f} points (95% CI "
                         f"{boot['ci_low'] * 100:+.2f} to {boot['ci_high'] * 100:+.2f}), "
                         + ("significant." if inter["significant"] else "not significant."))
    best = payload["recommendation"]
    deploy = (f"Deploy `{best['variant']}`: it has the highest mean validation accuracy ({best['best_val_accuracy']:.4f}), "
              f"which is what `make register` uses; its mean test accuracy is {best['test_accuracy']:.4f}.")
    if "baseline_test_accuracy" in best:
        gap = (best["test_accuracy"] - best["baseline_test_accuracy"]) * 100
        deploy += (f" The TF-IDF + logistic regression baseline reaches {best['baseline_test_accuracy']:.4f}: the "
                   f"Transformer is {abs(gap):.2f} points {'above' if gap > 0 else 'below'} it"
                   + ("." if gap > 0 else ", so a user who only needs accuracy on this data should deploy the baseline."))
    return " ".join(sentences + [deploy])


def correctness(predictions: pd.DataFrame) -> np.ndarray:
    return predictions["correct"].to_numpy(dtype=bool)


# --------------------------------------------------------------------------- baseline


def run_baseline(config: Config, key: str, force: bool = False) -> dict:
    """Train/evaluate the baseline as a child run, or reuse a finished one with the same key."""
    existing = None if force else find_baseline_run(config, key)
    out_dir = config.reports_dir / f"baseline-{key}"
    predictions_path = out_dir / "test_predictions.parquet"
    if existing is not None and predictions_path.is_file():
        return {"variant": "baseline", "seed": None, "run_id": existing.info.run_id,
                "predictions": pd.read_parquet(predictions_path),
                "metrics": summary_metrics(existing.data.metrics)}
    from pipeline.evaluate import prediction_frame

    ingest_dir = require_output(config, "ingest")
    train = pd.read_parquet(ingest_dir / "train.parquet")
    test = pd.read_parquet(ingest_dir / "test.parquet")
    names = load_labels(ingest_dir)
    with mlflow.start_run(run_name="baseline-tfidf-logreg", nested=True) as child:
        started = time.perf_counter()
        model = tfidf_baseline(train, seed=config.data.seed)
        probabilities = model.predict_proba(test["text"])
        seconds = time.perf_counter() - started
        metrics = {f"test_{k}": v for k, v in classification_metrics(test["label"].to_numpy(), probabilities,
                                                                      names).items()}
        metrics["train_seconds"] = seconds
        if {behaviour.NEGATIVE, behaviour.POSITIVE} <= set(names):  # the same behaviour tests as the Transformers
            results = behaviour.evaluate_suite(behaviour.build_suite(), model.predict_proba, names)
            metrics.update({behaviour.metric_name(r.capability): float(r.pass_rate)
                            for r in behaviour.pass_rates(results).itertuples()})
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
            "metrics": summary_metrics(metrics)}


# --------------------------------------------------------------------------- reports


def plot_comparison(payload: dict, path: Path) -> Path:
    from pipeline.plots import new_figure, save_figure

    summary, names = payload["summary"], payload["variants"]
    figure, (accuracy_axis, effect_axis) = new_figure(width=12, height=4.5, ncols=2)
    for x, name in enumerate(names):
        values = summary[name]["test_accuracy"]["values"]
        accuracy_axis.scatter([x] * len(values), values, color="tab:blue", zorder=3, label="one seed" if x == 0 else None)
        accuracy_axis.errorbar(x + 0.1, summary[name]["test_accuracy"]["mean"], yerr=summary[name]["test_accuracy"]["std"],
                               fmt="s", color="black", capsize=4, label="mean ± std" if x == 0 else None)
    if "baseline" in summary:
        accuracy_axis.axhline(summary["baseline"]["test_accuracy"]["mean"], color="tab:gray", linestyle="--",
                              label="TF-IDF + logistic regression")
    accuracy_axis.set_xticks(range(len(names)), names, rotation=15)
    accuracy_axis.set(ylabel="test accuracy", title="Test accuracy by variant")
    accuracy_axis.legend(fontsize=8)

    rows = [(f"{e['factor']}: {e['a']} - {e['b']}", e["bootstrap"]) for e in payload["effects"].values()]
    if payload.get("interaction"):
        rows.append(("interaction", payload["interaction"]["bootstrap"]))
    for y, (label, boot) in enumerate(rows):
        effect_axis.errorbar(100 * boot["difference"], y, xerr=[[100 * (boot["difference"] - boot["ci_low"])],
                                                                [100 * (boot["ci_high"] - boot["difference"])]],
                             fmt="o", capsize=5, color="tab:orange")
    effect_axis.axvline(0, color="black", linewidth=0.8)
    effect_axis.set_yticks(range(len(rows)), [label for label, _ in rows])
    effect_axis.set(xlabel="test accuracy difference (points), paired bootstrap 95% CI", title="Effects")
    return save_figure(figure, path)


def behaviour_table(payload: dict) -> list[str]:
    """Mean behaviour pass rate per capability (rows) and variant (columns), when the runs have them."""
    columns = [name for name in payload["variants"] + ["baseline"] if name in payload["summary"]]
    capabilities = [c for c in behaviour.CAPABILITIES
                    if any(behaviour.metric_name(c) in payload["summary"][name] for name in columns)]
    if not capabilities:
        return []
    lines = ["", "## Behaviour tests (mean pass rate over seeds)", "",
             "CheckList-style tests on sentences the project writes (`pipeline/behaviour.py`; each run's failing "
             "sentences are in `reports/<run_id>/behaviour.md`).", "",
             "| capability | " + " | ".join(f"`{name}`" for name in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for capability in capabilities:
        cells = [payload["summary"][name].get(behaviour.metric_name(capability)) for name in columns]
        lines.append(f"| {capability} | " + " | ".join("–" if c is None else f"{c['mean']:.0%}" for c in cells) + " |")
    return lines


def factors_text(payload: dict) -> str:
    return ", ".join(f"`{key}` ({a} vs {b})" for key, (a, b) in payload["factors"].items())


def parent_description(payload: dict) -> str:
    """The comparison parent run's description in the MLflow UI: what was compared, the verdict, the table."""
    return "\n".join([f"**Comparison of {factors_text(payload)}** over seeds {payload['seeds']} on "
                      f"{payload['test_rows']:,} test reviews; child runs below, one per variant and seed, plus the "
                      "TF-IDF baseline. Full report: artifact `comparison/`.", "",
                      f"**Verdict.** {payload['verdict']}", ""] + summary_lines(payload))


def child_description(variant: dict[str, str], seed: int, factor: str, parent_id: str) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in variant.items())
    return (f"**{variant_name(variant)}**, seed {seed}: one model of the `{factor}` comparison (parent run "
            f"`{parent_id}`), trained with {settings} and otherwise the comparison's shared settings.")


def summary_lines(payload: dict) -> list[str]:
    """The table of variants: mean ± std over seeds of every summary metric."""
    lines = ["| variant | runs | test accuracy | test F1 | test ROC AUC | test log loss | test ECE | best val accuracy | train seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in payload["variants"] + ["baseline"]:
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
    return lines


def markdown_report(payload: dict) -> str:
    lines = [f"# Comparison: {factors_text(payload)}", "",
             f"MLflow parent run `{payload['parent_run_id']}`; seeds {payload['seeds']}; "
             f"{payload['test_rows']:,} test reviews; identical data, tokenizer, hyper-parameters and budget apart "
             f"from the factors.", ""]
    lines += summary_lines(payload)
    lines += behaviour_table(payload)
    lines += ["", "## Effects", ""]
    for effect in payload["effects"].values():
        boot = effect["bootstrap"]
        lines += [f"### {effect['factor']}: {effect['a']} - {effect['b']}", "",
                  f"- mean accuracy difference: {effect['mean_accuracy_difference'] * 100:+.2f} points",
                  f"- paired bootstrap 95% CI ({boot['samples']} resamples of test reviews): "
                  f"[{boot['ci_low'] * 100:+.2f}, {boot['ci_high'] * 100:+.2f}] points"]
        for s in effect["mcnemar"]:
            where = f" ({s['at']})" if "at" in s else ""
            lines.append(f"- seed {s['seed']}{where}: difference {s['accuracy_difference'] * 100:+.2f} points; McNemar exact "
                         f"p = {s['p_value']:.3g} (only {effect['a']} right: {s['only_a_correct']}, only {effect['b']} "
                         f"right: {s['only_b_correct']})")
        lines += [f"- criterion: {effect['criterion']}", ""]
    if payload.get("interaction"):
        inter = payload["interaction"]
        lines += ["### Interaction", "", f"- {inter['description']}: {inter['difference'] * 100:+.2f} points, paired "
                  f"bootstrap 95% CI [{inter['bootstrap']['ci_low'] * 100:+.2f}, {inter['bootstrap']['ci_high'] * 100:+.2f}]",
                  ""]
    lines += ["## Verdict", "", payload["verdict"], ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- stage entry point


def comparison_key(config: Config, name: str) -> str:
    tokenize_hash = manifest_hash(require_output(config, "tokenize"))[:8]
    sections = ("model", "training", "compare", "pretrain") + (("pseudo_label",) if config.training.pseudo_labels else ())
    return f"{name}-{config.section_hash(*sections)[:8]}-{tokenize_hash}"


def train_and_evaluate(config: Config, variant: dict[str, str], seed: int, parent_id: str, factor: str,
                       force: bool) -> dict:
    from pipeline import evaluate, train

    child_config = variant_config(config, variant, seed)
    run_dir = train.run(child_config, force=force)
    run_id = read_manifest(run_dir)["mlflow_run_id"]
    if adopt_child(run_id, parent_id) == parent_id:
        describe_run(run_id, child_description(variant, seed, factor, parent_id))
    predictions_path = evaluate.run(child_config, run=run_id, force=force) / "test_predictions.parquet"
    client = mlflow.tracking.MlflowClient()
    metrics = summary_metrics(client.get_run(run_id).data.metrics)
    return {"variant": variant_name(variant), "seed": seed, "run_id": run_id, "metrics": metrics,
            "predictions": pd.read_parquet(predictions_path)}


def run(config: Config, factor: str = "pooling", force: bool = False) -> Path:
    """Pretrain when a variant needs it, train and evaluate every (variant, seed) and the baseline, write the report.

    Finished children are reused; ``force`` retrains and re-evaluates every one of them.
    """
    started = time.perf_counter()
    require_output(config, "tokenize")
    design = DESIGNS[factor]
    grid = variants(design)
    names = [variant_name(v) for v in grid]
    seeds = list(config.compare.seeds)
    if any(v.get("init", config.model.init) == "pretrained" for v in grid) and not config.model.pretrained:
        from pipeline import pretrain

        pretrain.run(config)  # the shared starting point; skipped when up to date
    if config.training.pseudo_labels:
        from pipeline import pseudo_label

        pseudo_label.run(config)  # the same extra training data for every variant; skipped when up to date
    setup_tracking(config)
    key = comparison_key(config, factor)
    parent_id = find_comparison_run_id(config, key)
    with mlflow.start_run(run_id=parent_id, run_name=None if parent_id else f"compare-{factor}") as parent:
        parent_id = parent.info.run_id
        mlflow.set_tags(comparison_tags(key, factor, names, seeds))
        if not parent.data.params:
            varied = {f"model.{k}" for k, _ in design.factors}
            mlflow.log_params({k: v for k, v in flat_params(config).items() if k not in varied})
        children = [train_and_evaluate(config, variant, seed, parent_id, factor, force) for variant in grid for seed in seeds]
        baseline = run_baseline(config, key, force)
        set_members([child["run_id"] for child in children])

        order = children[0]["predictions"]["source_file"]
        for child in children[1:] + [baseline]:
            if not child["predictions"]["source_file"].equals(order):
                raise InputError(f"run {child['run_id']} was evaluated on different test rows; rerun `make evaluate`")
        correct = {name: np.stack([correctness(c["predictions"]) for c in children if c["variant"] == name])
                   for name in names}
        samples = config.compare.bootstrap_samples
        effects = {k: main_effect(design, i, correct, seeds, samples) for i, (k, _) in enumerate(design.factors)}
        summary = summarize_variants(children + [baseline])
        payload = {"factor": factor, "factors": {k: list(levels) for k, levels in design.factors},
                   "variants": names, "seeds": seeds, "parent_run_id": parent_id, "test_rows": int(len(order)),
                   "summary": summary, "effects": effects, "difference": effects[design.factors[0][0]],
                   "interaction": interaction(design, correct, samples) if len(design.factors) == 2 else None,
                   "recommendation": recommendation(summary, names)}
        payload["verdict"] = verdict(payload)

        reports = config.reports_dir
        json_path = atomic_write_json(reports / f"{design.report_name}.json", payload)
        md_path = atomic_write_text(reports / f"{design.report_name}.md", markdown_report(payload))
        png_path = plot_comparison(payload, reports / f"{design.report_name}.png")
        for path in (json_path, md_path, png_path):
            mlflow.log_artifact(str(path), "comparison")
        describe_run(parent_id, parent_description(payload))
        first = payload["difference"]
        mlflow.log_metrics({"mean_accuracy_difference": first["mean_accuracy_difference"],
                            "bootstrap_ci_low": first["bootstrap"]["ci_low"],
                            "bootstrap_ci_high": first["bootstrap"]["ci_high"],
                            "significant": float(first["significant"])})
    effects_text = "; ".join(f"{e['factor']} {e['a']} - {e['b']} = {e['mean_accuracy_difference'] * 100:+.2f} points "
                             f"({'significant' if e['significant'] else 'not significant'})" for e in effects.values())
    print(f"compare: {len(children)} runs + baseline on {len(order):,} test reviews; {effects_text}; deploy "
          f"{payload['recommendation']['variant']}; wrote {md_path}, {json_path.name}, {png_path.name} in "
          f"{time.perf_counter() - started:.0f}s")
    return md_path


def main(config: Config, args) -> None:
    run(config, factor=args.factor, force=args.force)
