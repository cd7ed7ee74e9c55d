"""A comparison's numbers from its candidates: per-candidate summaries, factor effects, the recommendation.

Pure functions of :class:`pipeline.stages.compare.candidates.Candidate` lists and their correctness arrays
(``name -> [runs, test rows]``, runs in seed order); the tests themselves (McNemar, the paired bootstrap,
``compare_pair``) are in ``pipeline.metrics``.
"""

from __future__ import annotations

import numpy as np

from pipeline.metrics import accuracy_interval, champion_choice, compare_pair, paired_bootstrap_difference
from pipeline.model.kinds import kind_of
from pipeline.stages.compare.candidates import NBSVM, SELECTION, Candidate
from pipeline.stages.compare.designs import Design, level_name, setting_text, variant_name, variants
from pipeline.text.crops import CROP_SPLITS, word_bucket_names, word_buckets


def correctness(candidates: list[Candidate]) -> dict[str, np.ndarray]:
    """Per candidate name, its runs' test correctness stacked in the order the runs come."""
    return {
        name: np.stack([c.correct for c in candidates if c.name == name])
        for name in dict.fromkeys(c.name for c in candidates)
    }


def mean_std(values: list[float]) -> dict[str, float | list[float]]:
    array = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "values": [float(v) for v in array],
    }


def summarize(candidates: list[Candidate]) -> dict[str, dict]:
    """Per candidate name: its kind, seeds, run ids and mean/std of every summary metric present."""
    summary: dict[str, dict] = {}
    for candidate in candidates:
        entry = summary.setdefault(candidate.name, {"kind": candidate.kind, "seeds": [], "run_ids": [], "_metrics": {}})
        entry["seeds"].append(candidate.seed)
        entry["run_ids"].append(candidate.run_id)
        for key, value in candidate.metrics.items():
            entry["_metrics"].setdefault(key, []).append(value)
    for entry in summary.values():
        for key, values in entry.pop("_metrics").items():
            entry[key] = mean_std(values)
    return summary


def main_effect(
    design: Design,
    index: int,
    correct: dict[str, np.ndarray],
    seeds: list[int],
    samples: int,
    name_of=variant_name,
    scope: str = "Transformer alone",
) -> dict:
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
            labels.append(
                {"seed": seed, **({"at": ", ".join(setting_text(k, v) for k, v in other.items())} if other else {})}
            )
    return {
        "factor": key.rsplit(".", 1)[-1],
        "a": level_name(key, a),
        "b": level_name(key, b),
        "scope": scope,
        **compare_pair(np.stack(rows_a), np.stack(rows_b), labels, samples),
    }


def versus(
    name_a: str, name_b: str, correct: dict[str, np.ndarray], seeds_a: list, seeds_b: list, samples: int
) -> dict:
    """Candidate A minus candidate B, matched on seed; a single-run candidate (NBSVM) pairs with every seed."""
    a, b = correct[name_a], correct[name_b]
    if len(b) == 1:
        b, seeds = np.repeat(b, len(a), axis=0), seeds_a
    elif len(a) == 1:
        a, seeds = np.repeat(a, len(b), axis=0), seeds_b
    else:
        seeds = seeds_a
    return {
        "factor": "candidate",
        "a": name_a,
        "b": name_b,
        "scope": "candidates",
        **compare_pair(a, b, [{"seed": seed} for seed in seeds], samples),
    }


def interaction(design: Design, correct: dict[str, np.ndarray], samples: int) -> dict:
    """For two factors: (A1 - B1 at the second factor's A2) minus (A1 - B1 at its B2), with a paired bootstrap CI."""
    (key1, (a1, b1)), (key2, (a2, b2)) = design.factors
    name = lambda v1, v2: variant_name({key1: v1, key2: v2})  # noqa: E731
    plus = correct[name(a1, a2)].astype(float) + correct[name(b1, b2)]
    minus = correct[name(b1, a2)].astype(float) + correct[name(a1, b2)]
    bootstrap = paired_bootstrap_difference(plus, minus, samples=samples, seed=0)
    short = lambda key: key.rsplit(".", 1)[-1]  # noqa: E731
    return {
        "description": f"({short(key1)} {level_name(key1, a1)} - {level_name(key1, b1)}) with "
        f"{short(key2)}={level_name(key2, a2)} minus the same with {short(key2)}={level_name(key2, b2)}",
        "difference": bootstrap["difference"],
        "bootstrap": bootstrap,
        "significant": bool(bootstrap["ci_low"] > 0 or bootstrap["ci_high"] < 0),
    }


def recommendation(summary: dict, candidates: list[str], tolerance: float) -> dict:
    """The candidate to deploy, as `make register` chooses (``metrics.champion_choice``, validation only): among the
    deployable kinds whose mean full-review validation accuracy is within ``tolerance`` of the best, the best mean
    accuracy on the validation sentence crops."""
    scored = [
        name for name in candidates if SELECTION in summary.get(name, {}) and kind_of(summary[name]["kind"]).deployable
    ]
    best = champion_choice(
        {name: summary[name][SELECTION]["mean"] for name in scored},
        {name: summary[name]["val_crop_accuracy"]["mean"] for name in scored if "val_crop_accuracy" in summary[name]},
        tolerance,
    )
    entry = {
        "variant": best,
        "kind": summary[best]["kind"],
        SELECTION: summary[best][SELECTION]["mean"],
        "test_accuracy": summary[best]["test_accuracy"]["mean"],
        "tolerance": tolerance,
        **{
            key: summary[best][key]["mean"]
            for key in ("val_crop_accuracy", "test_crop_accuracy")
            if key in summary[best]
        },
    }
    transformers = [name for name in scored if kind_of(summary[name]["kind"]).varies_pooling]
    if transformers:
        best_transformer = max(transformers, key=lambda name: summary[name][SELECTION]["mean"])
        entry["best_transformer"] = best_transformer
        entry["best_transformer_test_accuracy"] = summary[best_transformer]["test_accuracy"]["mean"]
    if NBSVM in summary:
        entry["baseline_test_accuracy"] = summary[NBSVM]["test_accuracy"]["mean"]
    return entry


def length_table(candidates: list[Candidate], test_words: np.ndarray) -> dict[str, dict[str, dict]]:
    """Per candidate name: accuracy with its Wilson interval (``metrics.accuracy_interval``, over the seed-mean of
    each row's correctness) per word bucket of the test reviews (``<=25``, ...) and on the validation and test
    sentence crops (``val crops``, ``test crops``; candidates scored on them only)."""
    buckets = word_buckets(np.asarray(test_words))
    table: dict[str, dict[str, dict]] = {}
    for name in dict.fromkeys(c.name for c in candidates):
        group = [c for c in candidates if c.name == name]
        correct = np.stack([c.correct for c in group]).mean(axis=0)
        row = {
            bucket: accuracy_interval(correct[buckets == bucket])
            for bucket in word_bucket_names()
            if (buckets == bucket).any()
        }
        crops = [c.crops for c in group if c.crops is not None]
        if len(crops) == len(group):
            for split in CROP_SPLITS:
                on_split = np.stack(
                    [frame.loc[frame["split"] == split, "correct"].to_numpy(dtype=bool) for frame in crops]
                ).mean(axis=0)
                row[f"{split} crops"] = accuracy_interval(on_split)
        table[name] = row
    return table
