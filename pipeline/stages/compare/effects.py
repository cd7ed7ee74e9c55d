"""A comparison's numbers from its candidates: per-candidate summaries, factor effects, the recommendation.

Pure functions of :class:`pipeline.stages.compare.candidates.Candidate` lists and their correctness arrays
(``name -> [runs, test rows]``, runs in seed order); the tests themselves (McNemar, the paired bootstrap,
``compare_pair``) are in ``pipeline.metrics``.
"""

from __future__ import annotations

import numpy as np

from pipeline.metrics import compare_pair, paired_bootstrap_difference
from pipeline.stages.compare.candidates import KINDS, NBSVM, Candidate
from pipeline.stages.compare.designs import Design, level_name, setting_text, variant_name, variants


def correctness(candidates: list[Candidate]) -> dict[str, np.ndarray]:
    """Per candidate name, its runs' test correctness stacked in the order the runs come."""
    return {name: np.stack([c.correct for c in candidates if c.name == name])
            for name in dict.fromkeys(c.name for c in candidates)}


def mean_std(values: list[float]) -> dict[str, float | list[float]]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
            "values": [float(v) for v in array]}


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


def recommendation(summary: dict, candidates: list[str]) -> dict:
    """The candidate to deploy: the highest mean validation accuracy (never test) among the deployable kinds,
    as `make register` chooses."""
    scored = [name for name in candidates if "best_val_accuracy" in summary.get(name, {})
              and KINDS[summary[name]["kind"]].deployable]
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
