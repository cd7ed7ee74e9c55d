"""``make compare``: every candidate for ``@champion`` trained, evaluated and compared by one protocol.

Reads:  ``data/tokenize/`` and ``data/ingest/`` (through the pretrain, pseudo-label, train and evaluate
        stages, which it runs through ``pipeline.stages.run_stage``).
Writes: one MLflow parent run with a child run per candidate: each Transformer variant and seed (the
        combinations of ``compare.poolings``, ``compare.inits``, ... with ``compare.seeds``), the NBSVM
        baseline, one fused model per Transformer run (its logits averaged with NBSVM's, the weight
        chosen on validation) and the TF-IDF reference; ``reports/comparison.{md,json,png}``
        (``reports/ablation_position.*`` for ``--design position``), also logged to the parent run.

Every variant uses the same data, tokenizer, hyper-parameters and budget; only the design's factors
and the seed change. Seeds are matched across variants, so McNemar's test compares predictions of
models trained with the same seed on the same test reviews, and the paired bootstrap resamples test
reviews jointly. For two factors the report gives both main effects (each averaged over the other
factor's levels) and their interaction; each effect is measured for the Transformer alone and inside
the fusion. The candidate to deploy is the one with the best mean validation accuracy: test is read
only for the report. Finished children are reused, so re-running after a crash continues where it stopped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from pipeline import behaviour
from pipeline.artifacts import (
    FUSION_FILE,
    KERAS_MODEL_FILE,
    LABELS_FILE,
    LEXICAL_MODEL_FILE,
    TEST_PREDICTIONS_FILE,
    TOKENIZER_DIR,
    VAL_PREDICTIONS_FILE,
    atomic_dump,
    atomic_write_parquet,
    atomic_write_json,
    atomic_write_text,
    manifest_hash,
    read_manifest,
    split_table,
    token_counts_file,
)
from pipeline.baseline import class_probabilities, nbsvm_baseline, tfidf_baseline
from pipeline.config import Config, Design
from pipeline.errors import InputError
from pipeline.evaluation import evaluate_model, log_evaluation
from pipeline.inference import FusedClassifier, LexicalClassifier, fuse_probabilities
from pipeline.metrics import classification_metrics, cross_fitted_accuracy, mcnemar_exact, paired_bootstrap_difference
from pipeline.predictions import from_probability_columns, prediction_frame
from pipeline.stages import own_tokenization, require_output, run_stage, stage_dir
from pipeline.text import load_labels
from pipeline.tracking import (
    MODEL_KIND_TAG,
    VARIANT_TAG,
    adopt_child,
    baseline_tags,
    comparison_tags,
    describe_run,
    find_baseline_run,
    find_comparison_run_id,
    find_fusion_run,
    flat_params,
    fusion_tags,
    log_pipeline_model,
    set_members,
    setup_tracking,
)

SIGNIFICANCE_LEVEL = 0.05
SUMMARY_METRICS = ("test_accuracy", "test_f1", "test_roc_auc", "test_log_loss", "test_ece", "best_val_accuracy",
                   "train_seconds")
NBSVM, TFIDF = "nbsvm", "tfidf"
BASELINE_LABELS = {NBSVM: "NBSVM (1-3-gram naive-Bayes logistic regression)",
                   TFIDF: "TF-IDF + logistic regression (reference)"}
EXAMPLE_TEXTS = ["A wonderful, moving film.", "Dull and far too long."]


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a comparison reports: ``SUMMARY_METRICS`` and the behaviour pass rates."""
    return {k: v for k, v in metrics.items() if k in SUMMARY_METRICS or behaviour.capability_of(k)}


# --------------------------------------------------------------------------- pure functions


def variants(design: Design) -> list[dict[str, Any]]:
    """Every combination of the design's factor levels, A levels first (keys ``section.key``)."""
    keys = [key for key, _ in design.factors]
    return [dict(zip(keys, values)) for values in itertools.product(*(levels for _, levels in design.factors))]


def level_name(key: str, value: Any) -> str:
    """``first_token`` for a text level; ``pseudo_labels=on`` for a switch."""
    if isinstance(value, bool):
        return f"{key.rsplit('.', 1)[-1]}={'on' if value else 'off'}"
    return str(value)


def setting_text(key: str, value: Any) -> str:
    """``init=scratch``; ``pseudo_labels=on``."""
    return level_name(key, value) if isinstance(value, bool) else f"{key.rsplit('.', 1)[-1]}={value}"


def variant_name(variant: dict[str, Any]) -> str:
    """``first_token/scratch`` for two factors; the bare level (``mean``) for one; ``transformer`` for none."""
    return "/".join(level_name(key, value) for key, value in variant.items()) or "transformer"


def fused_name(name: str) -> str:
    return f"{NBSVM}+{name}"


def variant_config(config: Config, design: Design, variant: dict[str, Any], seed: int) -> Config:
    """The config of one variant and seed: the design's fixed settings and this variant's levels (a configuration
    factor's level expanded into its settings)."""
    return config.with_settings([("training.seed", seed), *design.fixed, *design.settings(variant)])


def mean_std(values: list[float]) -> dict[str, float | list[float]]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
            "values": [float(v) for v in array]}


def summarize_variants(children: list[dict]) -> dict[str, dict]:
    """Per candidate: its kind, seeds, run ids and mean/std of every summary metric present."""
    summary: dict[str, dict] = {}
    for child in children:
        entry = summary.setdefault(child["variant"], {"kind": child["kind"], "seeds": [], "run_ids": [], "_metrics": {}})
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


def main_effect(design: Design, index: int, correct: dict[str, np.ndarray], seeds: list[int], samples: int,
                name_of=variant_name, scope: str = "Transformer alone") -> dict:
    """Factor ``index``'s A - B accuracy difference, matched on seed and on every other factor's level."""
    key, (a, b) = design.factors[index]
    rows_a, rows_b, labels = [], [], []
    for variant in variants(design):
        if variant[key] != a:
            continue
        other = {k: v for k, v in variant.items() if k != key}
        partner = name_of({**variant, key: b})
        for row, seed in enumerate(seeds):
            rows_a.append(correct[name_of(variant)][row])
            rows_b.append(correct[partner][row])
            labels.append({"seed": seed, **({"at": ", ".join(setting_text(k, v) for k, v in other.items())}
                                            if other else {})})
    return {"factor": key.rsplit(".", 1)[-1], "a": level_name(key, a), "b": level_name(key, b), "scope": scope,
            **compare_pair(np.stack(rows_a), np.stack(rows_b), labels, samples)}


def versus(name_a: str, name_b: str, correct: dict[str, np.ndarray], seeds_a: list, seeds_b: list,
           samples: int) -> dict:
    """Candidate A minus candidate B, matched on seed; a single-run candidate (NBSVM) pairs with every seed."""
    a, b = correct[name_a], correct[name_b]
    if len(b) == 1:
        b, seeds = np.repeat(b, len(a), axis=0), seeds_a
    elif len(a) == 1:
        a, seeds = np.repeat(a, len(b), axis=0), seeds_b
    else:
        seeds = seeds_a
    return {"factor": "candidate", "a": name_a, "b": name_b, "scope": "candidates",
            **compare_pair(a, b, [{"seed": seed} for seed in seeds], samples)}


def interaction(design: Design, correct: dict[str, np.ndarray], samples: int) -> dict:
    """For two factors: (A1 - B1 at the second factor's A2) minus (A1 - B1 at its B2), with a paired bootstrap CI."""
    (key1, (a1, b1)), (key2, (a2, b2)) = design.factors
    name = lambda v1, v2: variant_name({key1: v1, key2: v2})  # noqa: E731
    plus = correct[name(a1, a2)].astype(float) + correct[name(b1, b2)]
    minus = correct[name(b1, a2)].astype(float) + correct[name(a1, b2)]
    bootstrap = paired_bootstrap_difference(plus, minus, samples=samples, seed=0)
    short = lambda key: key.rsplit(".", 1)[-1]  # noqa: E731
    return {"description": f"({short(key1)} {level_name(key1, a1)} - {level_name(key1, b1)}) with "
                           f"{short(key2)}={level_name(key2, a2)} minus the same with {short(key2)}={level_name(key2, b2)}",
            "difference": bootstrap["difference"], "bootstrap": bootstrap,
            "significant": bool(bootstrap["ci_low"] > 0 or bootstrap["ci_high"] < 0)}


def best_fusion_weight(val_transformer: np.ndarray, val_lexical: np.ndarray, val_labels: np.ndarray,
                       steps: int) -> tuple[float, dict[float, float], float]:
    """The Transformer's weight in the fusion with the best validation accuracy (ties: lower log loss).

    Returns the weight, the validation accuracy of every weight tried (0, 1/(steps-1), ..., 1), and the
    cross-fitted validation accuracy of choosing the weight this way (``metrics.cross_fitted_accuracy``):
    the best of 21 weights on the rows it is scored on flatters the fusion, the cross-fitted one does not.
    """
    scores, correct = {}, {}
    for weight in np.linspace(0.0, 1.0, steps):
        fused = fuse_probabilities(val_transformer, val_lexical, float(weight))
        key = round(float(weight), 4)
        correct[key] = fused.argmax(axis=1) == val_labels
        log_loss = float(-np.log(np.clip(fused[np.arange(len(val_labels)), val_labels], 1e-7, 1.0)).mean())
        scores[key] = (float(correct[key].mean()), -log_loss)
    best = max(scores, key=lambda w: scores[w])
    return best, {w: s[0] for w, s in scores.items()}, cross_fitted_accuracy(correct)


def effect_sentence(effect: dict, n_test: int) -> str:
    difference, boot = effect["mean_accuracy_difference"], effect["bootstrap"]
    a, b, factor = effect["a"], effect["b"], effect["factor"]
    p_values = ", ".join(f"{s['p_value']:.3g}" for s in effect["mcnemar"])
    better, worse = (a, b) if difference > 0 else (b, a)
    subject = f"{factor} ({effect['scope']})" if effect["scope"] != "candidates" else "candidates"
    evidence = (f"{subject}: {a} minus {b} test accuracy is {difference * 100:+.2f} points over "
                f"{len(effect['mcnemar'])} matched pairs on {n_test:,} test reviews (paired bootstrap 95% CI "
                f"{boot['ci_low'] * 100:+.2f} to {boot['ci_high'] * 100:+.2f}; McNemar p per pair: {p_values}).")
    if effect["significant"]:
        return evidence + (f" Significant: {better} beats {worse} on this test set under this budget "
                           "(the CI covers test-set sampling for these seeds, not other datasets, sizes or budgets).")
    return evidence + (" Not significant by the criterion: these runs do not show that either is better at this "
                       "budget; they do not show the two are equivalent either.")


def recommendation(summary: dict, candidates: list[str]) -> dict:
    """The candidate to deploy: the highest mean validation accuracy (never test), as `make register` chooses."""
    scored = [name for name in candidates if "best_val_accuracy" in summary.get(name, {})]
    best = max(scored, key=lambda name: summary[name]["best_val_accuracy"]["mean"])
    entry = {"variant": best, "kind": summary[best]["kind"], "best_val_accuracy": summary[best]["best_val_accuracy"]["mean"],
             "test_accuracy": summary[best]["test_accuracy"]["mean"]}
    transformers = [name for name in scored if summary[name]["kind"] == "transformer"]
    if transformers:
        best_transformer = max(transformers, key=lambda name: summary[name]["best_val_accuracy"]["mean"])
        entry["best_transformer"] = best_transformer
        entry["best_transformer_test_accuracy"] = summary[best_transformer]["test_accuracy"]["mean"]
    if NBSVM in summary:
        entry["baseline_test_accuracy"] = summary[NBSVM]["test_accuracy"]["mean"]
    return entry


def deploy_sentence(best: dict) -> str:
    kind = {"transformer": "a Transformer alone", "lexical": "the NBSVM baseline alone",
            "fusion": "NBSVM fused with a Transformer (one artifact)"}[best["kind"]]
    sentence = (f"Deploy `{best['variant']}`, {kind}: it has the highest mean validation accuracy "
                f"({best['best_val_accuracy']:.4f}) of every candidate, which is what `make register` uses; its mean "
                f"test accuracy is {best['test_accuracy']:.4f}.")
    if "baseline_test_accuracy" in best and best["variant"] != NBSVM:
        gap = (best["test_accuracy"] - best["baseline_test_accuracy"]) * 100
        sentence += (f" That is {abs(gap):.2f} points {'above' if gap > 0 else 'below'} the NBSVM baseline "
                     f"({best['baseline_test_accuracy']:.4f}) on test.")
    if "best_transformer" in best and best["best_transformer"] != best["variant"]:
        sentence += (f" The best Transformer alone (`{best['best_transformer']}`) reaches "
                     f"{best['best_transformer_test_accuracy']:.4f}.")
    return sentence


def verdict(payload: dict) -> str:
    sentences = [effect_sentence(effect, payload["test_rows"]) for effect in payload["effects"].values()]
    for effect in payload.get("fusion_effects", {}).values():
        sentences.append(effect_sentence(effect, payload["test_rows"]))
    if payload.get("interaction"):
        inter = payload["interaction"]
        boot = inter["bootstrap"]
        sentences.append(f"Interaction, {inter['description']}: {inter['difference'] * 100:+.2f} points (95% CI "
                         f"{boot['ci_low'] * 100:+.2f} to {boot['ci_high'] * 100:+.2f}), "
                         + ("significant." if inter["significant"] else "not significant."))
    for effect in payload.get("versus", []):
        sentences.append(effect_sentence(effect, payload["test_rows"]))
    return " ".join(sentences + [deploy_sentence(payload["recommendation"])])


def correctness(predictions: pd.DataFrame) -> np.ndarray:
    return predictions["correct"].to_numpy(dtype=bool)


# --------------------------------------------------------------------------- the lexical models


def check_same_split(config: Config, tokenize_dir: Path) -> str:
    """The ingest manifest checksum the tokenize stage (every Transformer) was built from; an error naming both
    stages when the ingest folder has changed since (a model would be fused with one trained on other splits)."""
    ingest_sha256 = manifest_hash(require_output(config, "ingest"))
    tokenized_from = read_manifest(tokenize_dir)["inputs"]["ingest_manifest_sha256"]
    if tokenized_from != ingest_sha256:
        raise InputError(f"{tokenize_dir}/ was tokenized from another ingestion ({tokenized_from[:12]}) than "
                         f"{stage_dir(config, 'ingest')}/ ({ingest_sha256[:12]}): the Transformers and the lexical "
                         "models would be trained on different splits; rerun `make tokenize`")
    return ingest_sha256


def run_nbsvm(config: Config, key: str, frames: dict[str, pd.DataFrame], names: list[str], ingest_sha256: str,
              force: bool) -> dict:
    """Fit NBSVM (C chosen on validation), log it as a child run with its pyfunc model, or reuse a finished one."""
    out_dir = config.reports_dir / f"baseline-{NBSVM}-{key}"
    files = [out_dir / name for name in (TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, LEXICAL_MODEL_FILE, LABELS_FILE)]
    existing = None if force else find_baseline_run(config, key, NBSVM)
    if existing is not None and all(path.is_file() for path in files):
        return {"variant": NBSVM, "kind": "lexical", "seed": None, "run_id": existing.info.run_id, "out_dir": out_dir,
                "predictions": pd.read_parquet(files[0]), "val_predictions": pd.read_parquet(files[1]),
                "metrics": summary_metrics(existing.data.metrics)}
    settings = config.baseline
    print(f"compare: fitting NBSVM on {len(frames['train']):,} train reviews, C from {list(settings.nbsvm_c)} "
          "on validation ...", flush=True)
    fitted = nbsvm_baseline(frames["train"], frames["val"], settings.nbsvm_c, settings.ngram_max,
                            settings.max_features, settings.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_dump(fitted.model, out_dir / LEXICAL_MODEL_FILE)
    atomic_write_json(out_dir / LABELS_FILE, {"labels": list(names)})
    classifier = LexicalClassifier.from_paths(out_dir / LEXICAL_MODEL_FILE, out_dir)
    with mlflow.start_run(run_name="baseline-nbsvm", nested=True) as child:
        mlflow.set_tags({**baseline_tags(key, NBSVM), MODEL_KIND_TAG: "lexical", "ingest_manifest": ingest_sha256[:16]})
        mlflow.log_params(fitted.params)
        mlflow.log_metrics({**{f"val_accuracy_C_{c:g}": a for c, a in fitted.val_accuracy_by_c.items()},
                            "val_accuracy_chosen_c": fitted.val_accuracy,
                            "best_val_accuracy": fitted.val_accuracy_cross_fitted, "train_seconds": fitted.fit_seconds})
        evaluation = evaluate_model(classifier, frames["test"], frames["val"], out_dir, "NBSVM baseline",
                                    token_counts=frames.get("test_token_counts"),
                                    max_tokens=config.tokenizer.max_sequence_length - 1)
        log_evaluation(evaluation, out_dir)
        log_pipeline_model(LexicalClassifier(), LexicalClassifier.artifacts(out_dir / LEXICAL_MODEL_FILE, out_dir),
                           EXAMPLE_TEXTS)
        run_id = child.info.run_id
        metrics = {**evaluation.payload["metrics"], "best_val_accuracy": fitted.val_accuracy_cross_fitted,
                   "train_seconds": fitted.fit_seconds, **{behaviour.metric_name(c): r
                                                           for c, r in evaluation.payload["behaviour"].items()}}
    print(f"compare: NBSVM C={fitted.params['nbsvm.C']:g} val_accuracy {fitted.val_accuracy:.4f} "
          f"({fitted.val_accuracy_cross_fitted:.4f} cross-fitted), test_accuracy "
          f"{metrics['test_accuracy']:.4f} ({fitted.fit_seconds:.0f}s)")
    return {"variant": NBSVM, "kind": "lexical", "seed": None, "run_id": run_id, "out_dir": out_dir,
            "predictions": evaluation.predictions, "val_predictions": evaluation.val_predictions,
            "metrics": summary_metrics(metrics)}


def run_tfidf(config: Config, key: str, frames: dict[str, pd.DataFrame], names: list[str], force: bool) -> dict:
    """The TF-IDF + logistic regression reference row (no model logged: it is not a candidate)."""
    out_dir = config.reports_dir / f"baseline-{TFIDF}-{key}"
    predictions_path = out_dir / TEST_PREDICTIONS_FILE
    existing = None if force else find_baseline_run(config, key, TFIDF)
    if existing is not None and predictions_path.is_file():
        return {"variant": TFIDF, "kind": "reference", "seed": None, "run_id": existing.info.run_id,
                "predictions": pd.read_parquet(predictions_path), "metrics": summary_metrics(existing.data.metrics)}
    test = frames["test"]
    with mlflow.start_run(run_name="baseline-tfidf-logreg", nested=True) as child:
        started = time.perf_counter()
        model = tfidf_baseline(frames["train"], seed=config.data.seed)
        probabilities = class_probabilities(model, test["text"].tolist(), len(names))
        val_accuracy = float((class_probabilities(model, frames["val"]["text"].tolist(), len(names)).argmax(axis=1)
                              == frames["val"]["label"].to_numpy()).mean())
        seconds = time.perf_counter() - started
        metrics = {f"test_{k}": v for k, v in classification_metrics(test["label"].to_numpy(), probabilities,
                                                                      names).items()}
        metrics.update(train_seconds=seconds, val_accuracy=val_accuracy)
        if {behaviour.NEGATIVE, behaviour.POSITIVE} <= set(names):
            results = behaviour.evaluate_suite(behaviour.build_suite(),
                                               lambda texts: class_probabilities(model, texts, len(names)), names)
            metrics.update({behaviour.metric_name(r.capability): float(r.pass_rate)
                            for r in behaviour.pass_rates(results).itertuples()})
        mlflow.log_params({"model": "tfidf-1-2gram+logistic-regression", "tfidf.ngram_range": "1,2",
                           "tfidf.min_df": 2, "logreg.C": 4.0})
        mlflow.set_tags(baseline_tags(key, TFIDF))
        mlflow.log_metrics(metrics)
        predictions = prediction_frame(test["source_file"], test["label"].to_numpy(), probabilities, names)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_parquet(predictions, predictions_path)
        run_id = child.info.run_id
    print(f"compare: TF-IDF reference test_accuracy {metrics['test_accuracy']:.4f} ({seconds:.0f}s)")
    return {"variant": TFIDF, "kind": "reference", "seed": None, "run_id": run_id, "predictions": predictions,
            "metrics": summary_metrics(metrics)}


def run_fusion(config: Config, key: str, child: dict, lexical: dict, frames: dict[str, pd.DataFrame],
               names: list[str], force: bool) -> dict:
    """Fuse one Transformer run with NBSVM: the weight chosen on validation, one pyfunc artifact, its own run."""
    name = fused_name(child["variant"])
    out_dir = config.reports_dir / f"fusion-{child['run_id']}-{lexical['run_id']}"
    existing = None if force else find_fusion_run(config, key, child["run_id"], lexical["run_id"])
    paths = [out_dir / TEST_PREDICTIONS_FILE, out_dir / VAL_PREDICTIONS_FILE]
    if existing is not None and all(path.is_file() for path in paths):
        return {"variant": name, "kind": "fusion", "seed": child["seed"], "run_id": existing.info.run_id,
                "predictions": pd.read_parquet(paths[0]), "val_predictions": pd.read_parquet(paths[1]),
                "metrics": summary_metrics(existing.data.metrics)}
    tokenizer_dir = child["run_dir"] / TOKENIZER_DIR
    transformer_labels, lexical_labels = load_labels(tokenizer_dir), load_labels(lexical["out_dir"])
    if transformer_labels != lexical_labels:
        raise InputError(f"cannot fuse run {child['run_id']} (labels {transformer_labels}, {tokenizer_dir}) with "
                         f"run {lexical['run_id']} (labels {lexical_labels}, {lexical['out_dir']}): other label sets")
    for split, column in (("predictions", "test"), ("val_predictions", "validation")):
        if not child[split]["source_file"].equals(lexical[split]["source_file"]):
            raise InputError(f"cannot fuse run {child['run_id']} with run {lexical['run_id']}: they were evaluated "
                             f"on different {column} rows (other splits); rerun `make compare FORCE=1`")
    val_labels = frames["val"]["label"].to_numpy()
    val_t, val_l = (from_probability_columns(child["val_predictions"], names),
                    from_probability_columns(lexical["val_predictions"], names))
    weight, by_weight, honest = best_fusion_weight(val_t, val_l, val_labels, config.compare.fusion_weights)
    out_dir.mkdir(parents=True, exist_ok=True)
    fusion_file = atomic_write_json(out_dir / FUSION_FILE, {"transformer_weight": weight, "labels": names,
                                                            "transformer_run_id": child["run_id"],
                                                            "lexical_run_id": lexical["run_id"]})
    artifacts = FusedClassifier.artifacts(child["run_dir"] / KERAS_MODEL_FILE, tokenizer_dir,
                                          lexical["out_dir"] / LEXICAL_MODEL_FILE, fusion_file)
    classifier = FusedClassifier.from_artifacts(artifacts)
    test_probabilities = fuse_probabilities(from_probability_columns(child["predictions"], names),
                                            from_probability_columns(lexical["predictions"], names), weight)
    val_probabilities = fuse_probabilities(val_t, val_l, weight)
    with mlflow.start_run(run_name=f"fusion-{child['variant']}-seed{child['seed']}".replace("/", "-"), nested=True) as run:
        mlflow.set_tags(fusion_tags(key, name, child["run_id"], lexical["run_id"]))
        mlflow.log_params({"fusion.transformer_weight": weight, "fusion.weights_tried": config.compare.fusion_weights,
                           "fusion.transformer_run": child["run_id"], "fusion.lexical_run": lexical["run_id"],
                           "training.seed": child["seed"], **{f"fused.{k}": v for k, v in child["settings"].items()}})
        evaluation = evaluate_model(classifier, frames["test"], frames["val"], out_dir, f"{name}, seed {child['seed']}",
                                    token_counts=frames.get("test_token_counts"),
                                    max_tokens=child.get("max_tokens", config.tokenizer.max_sequence_length - 1),
                                    probabilities=test_probabilities, val_probabilities=val_probabilities)
        val_accuracy = honest  # what `make register` compares: the weight's choice is not scored on its own rows
        mlflow.log_metrics({"best_val_accuracy": honest, "val_accuracy_chosen_weight": by_weight[weight],
                            **{f"val_accuracy_w_{w:g}": a for w, a in by_weight.items()}})
        log_evaluation(evaluation, out_dir)
        log_pipeline_model(FusedClassifier(), artifacts, EXAMPLE_TEXTS)
        run_id = run.info.run_id
    metrics = {**evaluation.payload["metrics"], "best_val_accuracy": val_accuracy,
               **{behaviour.metric_name(c): r for c, r in evaluation.payload["behaviour"].items()}}
    print(f"compare: {name} seed {child['seed']}: weight {weight:g} on the Transformer, val_accuracy "
          f"{by_weight[weight]:.4f} at that weight ({honest:.4f} cross-fitted), test_accuracy "
          f"{metrics['test_accuracy']:.4f}")
    return {"variant": name, "kind": "fusion", "seed": child["seed"], "run_id": run_id,
            "predictions": evaluation.predictions, "val_predictions": evaluation.val_predictions,
            "metrics": summary_metrics(metrics)}


# --------------------------------------------------------------------------- reports


def plot_comparison(payload: dict, path: Path) -> Path:
    from pipeline.plots import new_figure, save_figure

    summary, names = payload["summary"], payload["candidates"]
    colours = {"transformer": "tab:blue", "fusion": "tab:purple", "lexical": "tab:green", "reference": "tab:gray"}
    figure, (accuracy_axis, effect_axis) = new_figure(width=13, height=5, ncols=2)
    for x, name in enumerate(names):
        entry = summary[name]
        values = entry["test_accuracy"]["values"]
        accuracy_axis.scatter([x] * len(values), values, color=colours[entry["kind"]], zorder=3)
        accuracy_axis.errorbar(x + 0.12, entry["test_accuracy"]["mean"], yerr=entry["test_accuracy"]["std"],
                               fmt="s", color="black", capsize=4, label="mean ± std" if x == 0 else None)
    accuracy_axis.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    accuracy_axis.set(ylabel="test accuracy", title="Test accuracy by candidate (dots: seeds)")
    accuracy_axis.legend(fontsize=8)

    effects = list(payload["effects"].values()) + list(payload.get("fusion_effects", {}).values()) + payload.get("versus", [])
    rows = [(f"{e['factor']}: {e['a']} - {e['b']}" + (f" ({e['scope']})" if e["scope"] != "candidates" else ""),
             e["bootstrap"]) for e in effects]
    if payload.get("interaction"):
        rows.append(("interaction", payload["interaction"]["bootstrap"]))
    for y, (label, boot) in enumerate(rows):
        effect_axis.errorbar(100 * boot["difference"], y, xerr=[[100 * (boot["difference"] - boot["ci_low"])],
                                                                [100 * (boot["ci_high"] - boot["difference"])]],
                             fmt="o", capsize=5, color="tab:orange")
    effect_axis.axvline(0, color="black", linewidth=0.8)
    effect_axis.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    effect_axis.set(xlabel="test accuracy difference (points), paired bootstrap 95% CI", title="Effects")
    return save_figure(figure, path)


def candidate_label(name: str, kind: str) -> str:
    if name in BASELINE_LABELS:
        return BASELINE_LABELS[name]
    return f"`{name}`" + (" (fused)" if kind == "fusion" else "")


def behaviour_table(payload: dict) -> list[str]:
    """Mean behaviour pass rate per capability (rows) and candidate (columns), when the runs have them."""
    columns = [name for name in payload["candidates"] if name in payload["summary"]]
    capabilities = [c for c in behaviour.CAPABILITIES
                    if any(behaviour.metric_name(c) in payload["summary"][name] for name in columns)]
    if not capabilities:
        return []
    lines = ["", "## Behaviour tests (mean pass rate over seeds)", "",
             "CheckList-style tests on sentences the project writes (`pipeline/behaviour.py`; each run's failing "
             "sentences are in its `evaluation/behaviour.md`).", "",
             "| capability | " + " | ".join(f"`{name}`" for name in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for capability in capabilities:
        cells = [payload["summary"][name].get(behaviour.metric_name(capability)) for name in columns]
        lines.append(f"| {capability} | " + " | ".join("–" if c is None else f"{c['mean']:.0%}" for c in cells) + " |")
    return lines


def factors_text(payload: dict) -> str:
    if not payload["factors"]:
        return "one Transformer configuration"
    return ", ".join(f"`{key}` ({a} vs {b})" for key, (a, b) in payload["factors"].items())


def parent_description(payload: dict) -> str:
    """The comparison parent run's description in the MLflow UI: what was compared, the verdict, the table."""
    return "\n".join([f"**Comparison of {factors_text(payload)}** over seeds {payload['seeds']} on "
                      f"{payload['test_rows']:,} test reviews; child runs below: every Transformer variant and seed, "
                      "the NBSVM baseline, the fused candidates and the TF-IDF reference. Full report: artifact "
                      "`comparison/`.", "", f"**Verdict.** {payload['verdict']}", ""] + summary_lines(payload))


def child_description(variant: dict[str, Any], seed: int, design: str, parent_id: str) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in variant.items()) or "the comparison's settings"
    return (f"**{variant_name(variant)}**, seed {seed}: one Transformer of the `{design}` comparison (parent run "
            f"`{parent_id}`), trained with {settings} and otherwise the comparison's shared settings.")


def summary_lines(payload: dict) -> list[str]:
    """The table of candidates: mean ± std over seeds of every summary metric."""
    lines = ["| candidate | kind | runs | test accuracy | test F1 | test ROC AUC | test log loss | test ECE | "
             "best val accuracy | train seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in payload["candidates"]:
        entry = payload["summary"].get(name)
        if entry is None:
            continue
        cells = []
        for key in SUMMARY_METRICS:
            stat = entry.get(key)
            cells.append("–" if stat is None else (f"{stat['mean']:.4f} ± {stat['std']:.4f}" if key != "train_seconds"
                                                   else f"{stat['mean']:.0f} ± {stat['std']:.0f}"))
        lines.append(f"| {candidate_label(name, entry['kind'])} | {entry['kind']} | {len(entry['run_ids'])} | "
                     + " | ".join(cells) + " |")
    return lines


def effect_lines(effect: dict) -> list[str]:
    boot = effect["bootstrap"]
    title = f"### {effect['factor']}: {effect['a']} - {effect['b']}" + (
        f" ({effect['scope']})" if effect["scope"] != "candidates" else "")
    lines = [title, "", f"- mean accuracy difference: {effect['mean_accuracy_difference'] * 100:+.2f} points",
             f"- paired bootstrap 95% CI ({boot['samples']} resamples of test reviews): "
             f"[{boot['ci_low'] * 100:+.2f}, {boot['ci_high'] * 100:+.2f}] points"]
    for s in effect["mcnemar"]:
        where = f" ({s['at']})" if "at" in s else ""
        lines.append(f"- seed {s['seed']}{where}: difference {s['accuracy_difference'] * 100:+.2f} points; McNemar exact "
                     f"p = {s['p_value']:.3g} (only {effect['a']} right: {s['only_a_correct']}, only {effect['b']} "
                     f"right: {s['only_b_correct']})")
    return lines + [f"- criterion: {effect['criterion']}", ""]


def markdown_report(payload: dict) -> str:
    lines = [f"# Comparison: {factors_text(payload)}", "",
             f"MLflow parent run `{payload['parent_run_id']}`; seeds {payload['seeds']}; "
             f"{payload['test_rows']:,} test reviews, {payload['val_rows']:,} validation reviews "
             f"({payload['split_rule']}); identical data, tokenizer, hyper-parameters and budget apart from the "
             "factors. Candidates are chosen on validation; test is read only for this report.", ""]
    for level, settings in payload.get("levels", {}).items():
        lines += [f"`{level}` sets " + ", ".join(f"`{key}` = {value:.4g}" if isinstance(value, float) else
                                                 f"`{key}` = {value}" for key, value in settings.items())
                  + "; the other level is the configuration as given.", ""]
    lines += summary_lines(payload)
    lines += behaviour_table(payload)
    lines += ["", "## Effects", ""]
    for effect in list(payload["effects"].values()) + list(payload.get("fusion_effects", {}).values()):
        lines += effect_lines(effect)
    if payload.get("interaction"):
        inter = payload["interaction"]
        lines += ["### Interaction", "", f"- {inter['description']}: {inter['difference'] * 100:+.2f} points, paired "
                  f"bootstrap 95% CI [{inter['bootstrap']['ci_low'] * 100:+.2f}, {inter['bootstrap']['ci_high'] * 100:+.2f}]",
                  ""]
    if payload.get("versus"):
        lines += ["## Candidates against each other", ""]
        for effect in payload["versus"]:
            lines += effect_lines(effect)
    if payload.get("fusion_weights"):
        lines += ["## Fusion weights (chosen on validation)", "",
                  "| fused candidate | seed | weight on the Transformer |", "| --- | --- | --- |"]
        lines += [f"| `{row['variant']}` | {row['seed']} | {row['weight']:g} |" for row in payload["fusion_weights"]]
        lines.append("")
    lines += ["## Verdict", "", payload["verdict"], ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- stage entry point


def comparison_key(config: Config, design_name: str, design: Design | None = None) -> str:
    """The comparison's identity: its design (a tuned level's settings included), the settings its candidates
    depend on, the tokenization.

    The pseudo-label settings count only when a variant trains on pseudo labels."""
    tokenize_hash = manifest_hash(require_output(config, "tokenize"))[:8]
    pseudo = (config.training.pseudo_labels or True in (config.compare.pseudo_labels or ())
              or design is not None and any(variant_config(config, design, v, 0).training.pseudo_labels
                                            for v in variants(design)))
    sections = ("model", "training", "compare", "pretrain", "baseline") + (("pseudo_label",) if pseudo else ())
    # compare.tuned names a file: the tuned level's settings count (below), not the file's name
    key = f"{design_name}-{config.replace(compare={'tuned': None}).section_hash(*sections)[:8]}-{tokenize_hash}"
    if design is not None and design.overlays:
        overlays = json.dumps(design.overlays, sort_keys=True, default=list).encode()
        key += f"-{hashlib.sha256(overlays).hexdigest()[:8]}"
    return key


def train_and_evaluate(config: Config, design: Design, variant: dict[str, Any], seed: int, parent_id: str,
                       design_name: str, force: bool) -> dict:
    # a tuned level that changes the tokenizer reads a tokenization of its own (made once, beside the others)
    child_config = own_tokenization(variant_config(config, design, variant, seed), config)
    run_dir = run_stage("train", child_config, force=force)
    run_id = read_manifest(run_dir)["mlflow_run_id"]
    if adopt_child(run_id, parent_id) == parent_id:
        describe_run(run_id, child_description(variant, seed, design_name, parent_id))
    client = mlflow.tracking.MlflowClient()
    if VARIANT_TAG not in client.get_run(run_id).data.tags:  # a run shared with another comparison keeps its name
        client.set_tag(run_id, VARIANT_TAG, variant_name(variant))
    out_dir = run_stage("evaluate", child_config, run=run_id, force=force)
    metrics = summary_metrics(mlflow.tracking.MlflowClient().get_run(run_id).data.metrics)
    settings = {key: level_name(key, value) for key, value in (*design.fixed, *variant.items(), *design.settings(variant))}
    settings.setdefault("model.pooling", child_config.model.pooling)  # what a fused champion's version is tagged with
    return {"variant": variant_name(variant), "kind": "transformer", "seed": seed, "run_id": run_id, "run_dir": run_dir,
            "max_tokens": child_config.tokenizer.max_sequence_length - 1,
            "metrics": metrics, "settings": settings, "predictions": pd.read_parquet(out_dir / TEST_PREDICTIONS_FILE),
            "val_predictions": pd.read_parquet(out_dir / VAL_PREDICTIONS_FILE)}


def read_frames(config: Config) -> tuple[dict[str, pd.DataFrame], list[str]]:
    ingest_dir = require_output(config, "ingest")
    frames = {split: pd.read_parquet(ingest_dir / split_table(split)) for split in ("train", "val", "test")}
    counts = stage_dir(config, "tokenize") / token_counts_file("test")
    if counts.is_file():
        frames["test_token_counts"] = np.load(counts)
    return frames, load_labels(ingest_dir)


def run(config: Config, design: str = "main", force: bool = False) -> Path:
    """Train and evaluate every candidate, fuse, compare and write the report. Finished children are reused;
    ``force`` retrains and re-evaluates every one of them."""
    started = time.perf_counter()
    tokenize_dir = require_output(config, "tokenize")
    spec = config.design(design)
    grid = variants(spec)
    names = [variant_name(v) for v in grid]
    seeds = list(config.compare.seeds)
    settings = [variant_config(config, spec, v, seeds[0]) for v in grid]
    if any(c.model.init == "pretrained" for c in settings) and not config.model.pretrained:
        run_stage("pretrain", config)  # the shared starting point; skipped when up to date
    if any(c.training.pseudo_labels for c in settings):
        run_stage("pseudo-label", config)  # the same extra training data for every variant; skipped when up to date
    ingest_sha256 = check_same_split(config, tokenize_dir)
    frames, labels = read_frames(config)
    setup_tracking(config)
    key = comparison_key(config, design, spec)
    parent_id = find_comparison_run_id(config, key)
    with_lexical = spec.champion_pool
    with mlflow.start_run(run_id=parent_id, run_name=None if parent_id else f"compare-{design}") as parent:
        parent_id = parent.info.run_id
        mlflow.set_tags(comparison_tags(key, design, names, seeds))
        if not parent.data.params:
            varied = {key for key, _ in spec.factors} | {key for v in grid for key, _ in spec.settings(v)}
            mlflow.log_params({k: v for k, v in flat_params(config).items() if k not in varied})
        children = [train_and_evaluate(config, spec, variant, seed, parent_id, design, force)
                    for variant in grid for seed in seeds]
        # the lexical models depend on the splits and their own settings only: comparisons that differ in seeds
        # or Transformer settings share them (and the fused runs of the Transformer runs they share)
        lexical_key = f"{ingest_sha256[:8]}-{config.section_hash('baseline')[:8]}"
        lexical = run_nbsvm(config, lexical_key, frames, labels, ingest_sha256, force) if with_lexical else None
        fused = ([run_fusion(config, f"{lexical_key}-w{config.compare.fusion_weights}", child, lexical, frames, labels,
                             force) for child in children] if with_lexical and config.compare.fusion else [])
        references = ([run_tfidf(config, f"{ingest_sha256[:8]}-{config.data.seed}", frames, labels, force)]
                      if with_lexical and config.compare.tfidf_baseline else [])
        members = children + ([lexical] if lexical else []) + fused

        order = children[0]["predictions"]["source_file"]
        for member in members[1:] + references:
            if not member["predictions"]["source_file"].equals(order):
                raise InputError(f"run {member['run_id']} was evaluated on different test rows; rerun `make evaluate`")
        everything = members + references
        correct = {name: np.stack([correctness(c["predictions"]) for c in everything if c["variant"] == name])
                   for name in dict.fromkeys(c["variant"] for c in everything)}
        samples = config.compare.bootstrap_samples
        effects = {k.rsplit(".", 1)[-1]: main_effect(spec, i, correct, seeds, samples)
                   for i, (k, _) in enumerate(spec.factors)}
        fusion_effects = ({f"{k.rsplit('.', 1)[-1]} (fused)": main_effect(
            spec, i, correct, seeds, samples, name_of=lambda v: fused_name(variant_name(v)), scope="inside the fusion")
            for i, (k, _) in enumerate(spec.factors)} if fused else {})
        summary = summarize_variants(everything)
        candidates = names + ([NBSVM] if lexical else []) + [fused_name(n) for n in names if fused] + \
            [r["variant"] for r in references]
        seeds_of = {name: [c["seed"] for c in everything if c["variant"] == name] for name in correct}
        best = recommendation(summary, [name for name in candidates if summary[name]["kind"] != "reference"])
        comparisons = []
        if lexical:
            best_transformer = best.get("best_transformer")
            pairs = [(best_transformer, NBSVM)] if best_transformer else []
            if fused:
                best_fused = max((fused_name(n) for n in names), key=lambda n: summary[n]["best_val_accuracy"]["mean"])
                pairs += [(best_fused, NBSVM), (best_fused, best_transformer)]
            comparisons = [versus(a, b, correct, seeds_of[a], seeds_of[b], samples) for a, b in pairs]
        payload = {"design": design, "factors": {k.rsplit(".", 1)[-1]: [level_name(k, v) for v in levels]
                                                 for k, levels in spec.factors},
                   "fixed": {k: level_name(k, v) for k, v in spec.fixed},
                   "levels": {level: {k: v for k, v in settings} for level, settings in spec.overlays if settings},
                   "variants": names, "candidates": candidates, "seeds": seeds, "parent_run_id": parent_id,
                   "test_rows": int(len(order)), "val_rows": int(len(frames["val"])),
                   "split_rule": read_manifest(stage_dir(config, "ingest")).get("split_rule", "stratified random"),
                   "summary": summary, "effects": effects, "fusion_effects": fusion_effects, "versus": comparisons,
                   "difference": next(iter(effects.values()), None),
                   "interaction": interaction(spec, correct, samples) if len(spec.factors) == 2 else None,
                   "fusion_weights": [{"variant": f["variant"], "seed": f["seed"],
                                       "weight": float(mlflow.get_run(f["run_id"]).data.params["fusion.transformer_weight"])}
                                      for f in fused],
                   "recommendation": best}
        payload["verdict"] = verdict(payload)

        reports = config.reports_dir
        json_path = atomic_write_json(reports / f"{spec.report_name}.json", payload)
        md_path = atomic_write_text(reports / f"{spec.report_name}.md", markdown_report(payload))
        png_path = plot_comparison(payload, reports / f"{spec.report_name}.png")
        for path in (json_path, md_path, png_path):
            mlflow.log_artifact(str(path), "comparison")
        describe_run(parent_id, parent_description(payload))
        set_members({member["run_id"]: member["variant"] for member in members})  # last: a finished comparison
        if payload["difference"]:
            first = payload["difference"]
            mlflow.log_metrics({"mean_accuracy_difference": first["mean_accuracy_difference"],
                                "bootstrap_ci_low": first["bootstrap"]["ci_low"],
                                "bootstrap_ci_high": first["bootstrap"]["ci_high"],
                                "significant": float(first["significant"])})
        mlflow.log_metrics({"recommended_val_accuracy": best["best_val_accuracy"],
                            "recommended_test_accuracy": best["test_accuracy"]})
    effects_text = "; ".join(f"{e['factor']} {e['a']} - {e['b']} = {e['mean_accuracy_difference'] * 100:+.2f} points "
                             f"({'significant' if e['significant'] else 'not significant'})" for e in effects.values())
    print(f"compare: {len(children)} Transformer runs, {len(members) - len(children)} lexical and fused candidates and "
          f"{len(references)} reference on {len(order):,} test reviews; {effects_text or 'no factor varied'}; deploy "
          f"{best['variant']} (val {best['best_val_accuracy']:.4f}, test {best['test_accuracy']:.4f}); wrote {md_path}, "
          f"{json_path.name}, {png_path.name} in {time.perf_counter() - started:.0f}s")
    return md_path


def main(config: Config, args) -> None:
    run(config, design=args.design, force=args.force)
