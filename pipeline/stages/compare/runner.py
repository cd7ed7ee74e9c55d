"""The comparison's loop: every candidate of a design trained (or reused), evaluated, compared and reported.

Reads:  ``data/tokenize/`` and ``data/ingest/`` (``data/pretrain/``, ``data/pseudo_label/`` when a variant
        needs them; they are made first when missing or stale).
Writes: one MLflow parent run with a child run per candidate: each Transformer variant and seed (the
        combinations of the design's levels with ``compare.seeds``), the NBSVM baseline, one fused model per
        Transformer run (its log-probabilities averaged with NBSVM's, the weight chosen on validation) and the
        TF-IDF reference; ``reports/<design report>.{md,json,png}``, also logged to the parent run.

Every variant uses the same data, tokenizer, hyper-parameters and budget; only the design's factors and
the seed change. Seeds are matched across variants, so McNemar's test compares predictions of models
trained with the same seed on the same test reviews, and the paired bootstrap resamples test reviews
jointly. For two factors the report gives both main effects and their interaction; each effect is
measured for the Transformer alone and inside the fusion. The candidate to deploy is the one with the
best mean validation accuracy: test is read only for the report. Finished children are reused, so
re-running after a crash continues where it stopped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import mlflow
import numpy as np

from pipeline.config import CompareConfig, Config
from pipeline.core.catalog import require_output, stage_dir
from pipeline.core.checkpoints import checkpoint_name
from pipeline.core.errors import InputError
from pipeline.core.files import manifest_hash, require_manifest
from pipeline.core.logs import duration
from pipeline.stages.compare import effects
from pipeline.stages.compare.candidates import NBSVM, SELECTION, Candidate, fused_name
from pipeline.stages.compare.designs import Design, design_for, level_name, variant_config, variant_name, variants
from pipeline.stages.compare.producers import (
    fusion_candidate,
    fusion_suffix,
    nbsvm_candidate,
    tfidf_candidate,
    transformer_candidate,
)
from pipeline.stages.compare.report import parent_description, verdict, write_reports
from pipeline.stages.evaluate.lengths import CROP_SEED
from pipeline.stages.pretrain.masked_lm import pretrain
from pipeline.stages.pseudo_label.teacher import with_pseudo_labels
from pipeline.stages.tokenize.outputs import read_ingested_rows
from pipeline.text.crops import word_counts
from pipeline.tracking import (
    FUSION_WEIGHT_PARAM,
    comparison_tags,
    describe_run,
    find_comparison_run_id,
    flat_params,
    set_members,
    setup_tracking,
)


def comparison_key(config: Config, design_name: str, design: Design | None = None) -> str:
    """The comparison's identity: its design (a tuned level's settings included), the settings its candidates
    depend on, the tokenization.

    The pseudo-label settings count only when a variant trains on pseudo labels."""
    tokenize_hash = manifest_hash(require_output(config, "tokenize"))[:8]
    pseudo = (
        config.training.pseudo_labels
        or True in (config.compare.pseudo_labels or ())
        or design is not None
        and any(variant_config(config, design, v, 0).training.pseudo_labels for v in variants(design))
    )
    sections = ("model", "training", "compare", "pretrain", "nbsvm") + (("pseudo_label",) if pseudo else ())
    # compare.tuned names a file: the tuned level's settings count (below), not the file's name
    # nor does the champion rule's tolerance: it chooses among the runs, it makes none
    unkeyed = config.replace(compare={"tuned": None, "champion_tolerance": CompareConfig.champion_tolerance})
    key = f"{design_name}-{unkeyed.section_hash(*sections)[:8]}-{tokenize_hash}"
    if design is not None and design.overlays:
        overlays = json.dumps(design.overlays, sort_keys=True, default=list).encode()
        key += f"-{hashlib.sha256(overlays).hexdigest()[:8]}"
    return key


T = TypeVar("T")


KIND_NAMES = {
    "transformer": ("Transformer run", "Transformer runs"),
    "nbsvm": ("NBSVM", "NBSVM"),
    "fusion": ("fusion", "fusions"),
    "tfidf": ("TF-IDF", "TF-IDF"),
}


def time_left(finished: dict[str, list[float]], remaining: list[str]) -> tuple[float, dict[str, int]]:
    """Seconds the ``remaining`` candidates of a kind already timed should take (the mean of that kind's ``finished``
    times), and how many of each kind not timed yet are left. A kind is not guessed from another: a pretrained
    encoder's run can take an hour where NBSVM takes minutes."""
    seconds = sum(sum(finished[kind]) / len(finished[kind]) for kind in remaining if finished.get(kind))
    return seconds, dict(Counter(kind for kind in remaining if not finished.get(kind)))


def estimate_text(seconds: float, untimed: dict[str, int], names: dict[str, tuple[str, str]] = KIND_NAMES) -> str:
    """``about 12m30s left``, ``about 12m30s left, then NBSVM, 3 fusions and TF-IDF (not timed yet)``, or with
    nothing timed left ``NBSVM, a fusion and TF-IDF left, not timed yet``."""
    named = {kind: names.get(kind, (kind, kind)) for kind in untimed}
    words = [named[kind][0] if count == 1 else f"{count} {named[kind][1]}" for kind, count in untimed.items()]
    listed = ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)
    if not seconds:
        return f"{listed} left, not timed yet" if listed else "nothing left"
    return f"about {duration(seconds)} left" + (f", then {listed} (not timed yet)" if listed else "")


@dataclass
class Progress:
    """One line as each candidate starts: its index of the total, the time so far and an estimate of what is left."""

    kinds: list[str]  # every candidate's kind, in the order they run
    started: float = field(default_factory=time.perf_counter)
    finished: dict[str, list[float]] = field(default_factory=dict)
    names: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(KIND_NAMES))  # kind: (one, several)

    def run(self, label: str, kind: str, work: Callable[[], T]) -> T:
        index = sum(len(times) for times in self.finished.values())
        estimate = (
            estimate_text(*time_left(self.finished, self.kinds[index:]), self.names)
            if self.finished
            else "estimate after the first"
        )
        print(
            f"compare: [{index + 1}/{len(self.kinds)}] {label}: {duration(time.perf_counter() - self.started)} "
            f"elapsed, {estimate}",
            flush=True,
        )
        began = time.perf_counter()
        result = work()
        self.finished.setdefault(kind, []).append(time.perf_counter() - began)
        return result


@dataclass(frozen=True)
class CandidatePool:
    """A comparison's candidates: a run per Transformer variant and seed, the NBSVM baseline (None when the design
    leaves the lexical models out), a fused run per Transformer run, and the references (TF-IDF)."""

    transformers: list[Candidate]
    lexical: Candidate | None
    fused: list[Candidate]
    references: list[Candidate]

    @property
    def members(self) -> list[Candidate]:
        """The parent run's members: every candidate but the references."""
        return self.transformers + ([self.lexical] if self.lexical else []) + self.fused

    @property
    def everything(self) -> list[Candidate]:
        return self.members + self.references


def comparison_payload(
    config: Config,
    design_name: str,
    design: Design,
    pool: CandidatePool,
    parent_id: str,
    val_rows: int,
    test_words: np.ndarray,
) -> dict:
    """Everything the report says, from the candidates: summaries, effects, pairs of candidates, accuracy by length
    (``test_words``: each test review's words), the verdict."""
    names = [variant_name(v) for v in variants(design)]
    seeds = list(config.compare.seeds)
    lexical, fused, everything = pool.lexical, pool.fused, pool.everything
    order = everything[0].predictions["source_file"]
    for candidate in everything[1:]:
        if not candidate.predictions["source_file"].equals(order):
            raise InputError(f"run {candidate.run_id} was evaluated on different test rows; rerun `make evaluate`")
    correct = effects.correctness(everything)
    samples = config.compare.bootstrap_samples
    main_effects = {
        k.rsplit(".", 1)[-1]: effects.main_effect(design, i, correct, seeds, samples)
        for i, (k, _) in enumerate(design.factors)
    }
    fusion_effects = (
        {
            f"{k.rsplit('.', 1)[-1]} (fused)": effects.main_effect(
                design,
                i,
                correct,
                seeds,
                samples,
                name_of=lambda v: fused_name(variant_name(v)),
                scope="inside the fusion",
            )
            for i, (k, _) in enumerate(design.factors)
        }
        if fused
        else {}
    )
    summary = effects.summarize(everything)
    candidates = list(dict.fromkeys(c.name for c in everything))
    seeds_of = {name: [c.seed for c in everything if c.name == name] for name in correct}
    best = effects.recommendation(summary, candidates, config.compare.champion_tolerance)
    pairs: list[tuple[str, str]] = []
    if lexical:
        best_transformer = best.get("best_transformer")
        pairs = [(best_transformer, NBSVM)] if best_transformer else []
        if fused:
            if not best_transformer:  # the fused runs are made of Transformer runs: one of them is the best
                raise ValueError("fused candidates without a scored Transformer candidate to set them against")
            best_fused = max((fused_name(n) for n in names), key=lambda n: summary[n][SELECTION]["mean"])
            pairs += [(best_fused, NBSVM), (best_fused, best_transformer)]
    payload = {
        "design": design_name,
        "encoder": candidate_label(config.model.preset, "transformer"),
        "preset": config.model.preset,
        "factors": {k.rsplit(".", 1)[-1]: [level_name(k, v) for v in levels] for k, levels in design.factors},
        "fixed": {k: level_name(k, v) for k, v in design.fixed},
        "levels": {level: {k: v for k, v in settings} for level, settings in design.overlays if settings},
        "variants": names,
        "candidates": candidates,
        "seeds": seeds,
        "parent_run_id": parent_id,
        "test_rows": int(len(order)),
        "val_rows": int(val_rows),
        "split_rule": require_manifest(stage_dir(config, "ingest")).get("split_rule", "stratified random"),
        "summary": summary,
        "effects": main_effects,
        "fusion_effects": fusion_effects,
        "versus": [effects.versus(a, b, correct, seeds_of[a], seeds_of[b], samples) for a, b in pairs],
        "difference": next(iter(main_effects.values()), None),
        "interaction": effects.interaction(design, correct, samples) if len(design.factors) == 2 else None,
        "fusion_weights": [
            {
                "variant": f.name,
                "seed": f.seed,
                "weight": float(mlflow.get_run(f.run_id).data.params[FUSION_WEIGHT_PARAM]),
            }
            for f in fused
        ],
        "lengths": effects.length_table(everything, test_words),
        "crop_seed": CROP_SEED,
        "recommendation": best,
    }
    payload["verdict"] = verdict(payload)
    return payload


def log_headline_metrics(payload: dict) -> None:
    """The parent run's metrics: the first factor's effect (when a factor varied) and the recommended candidate's
    accuracies."""
    if payload["difference"]:
        first = payload["difference"]
        mlflow.log_metrics(
            {
                "mean_accuracy_difference": first["mean_accuracy_difference"],
                "bootstrap_ci_low": first["bootstrap"]["ci_low"],
                "bootstrap_ci_high": first["bootstrap"]["ci_high"],
                "significant": float(first["significant"]),
            }
        )
    best = payload["recommendation"]
    mlflow.log_metrics(
        {"recommended_val_accuracy": best[SELECTION], "recommended_test_accuracy": best["test_accuracy"]}
    )


def candidate_label(preset: str | None, variant: str) -> str:
    """A progress line's name for a variant: ``Transformer first_token``, ``all-MiniLM-L6-v2 mean`` for a preset's,
    the encoder alone when no factor varies (``variant_name``'s ``transformer``)."""
    encoder = "Transformer" if preset is None else checkpoint_name(preset)
    return encoder if variant == "transformer" else f"{encoder} {variant}"


def run_candidates(
    config: Config, design: Design, design_name: str, parent_id: str, frames, force: bool, started: float
) -> CandidatePool:
    """Every candidate of the design, trained or fitted (or reused) in order under the parent run, with a progress
    line as each starts (:class:`Progress`)."""
    grid, seeds, with_lexical = variants(design), list(config.compare.seeds), design.champion_pool
    ingest_sha256, labels = frames.ingest_manifest_sha256, frames.labels
    fusing = with_lexical and config.compare.fusion
    runs = [(variant, seed) for variant in grid for seed in seeds]
    encoder = candidate_label(config.model.preset, "transformer")
    progress = Progress(
        ["transformer"] * len(runs)
        + ["nbsvm"] * with_lexical
        + ["fusion"] * (len(runs) * fusing)
        + ["tfidf"] * (with_lexical and config.compare.tfidf_baseline),
        started,
        names={**KIND_NAMES, "transformer": (f"{encoder} run", f"{encoder} runs")},
    )
    transformers = [
        progress.run(
            f"{candidate_label(config.model.preset, variant_name(variant))} seed {seed}",
            "transformer",
            functools.partial(transformer_candidate, config, design, variant, seed, parent_id, design_name, force),
        )
        for variant, seed in runs
    ]
    # the lexical models depend on the splits and their own settings only: comparisons that differ in seeds
    # or Transformer settings share them (and the fused runs of the Transformer runs they share)
    lexical_key = f"{ingest_sha256[:8]}-{config.section_hash('nbsvm')[:8]}"
    lexical = (
        progress.run(
            "NBSVM", "nbsvm", lambda: nbsvm_candidate(config, lexical_key, frames, labels, ingest_sha256, force)
        )
        if with_lexical
        else None
    )
    # a fusion's key: the lexical model's, the weights tried, a length-aware fusion's limit and a cascade's share
    # (none: as before them)
    fusion_key = f"{lexical_key}-w{config.compare.fusion_weights}" + fusion_suffix(config.compare)
    fused: list[Candidate] = []
    if fusing:
        if lexical is None:  # fusing implies with_lexical
            raise ValueError("compare.fusion without the NBSVM candidate to fuse with")
        fused = [
            progress.run(
                f"fusion of {child.name} seed {child.seed} with NBSVM",
                "fusion",
                functools.partial(fusion_candidate, config, fusion_key, child, lexical, frames, labels, force),
            )
            for child in transformers
        ]
    references = (
        [
            progress.run(
                "TF-IDF reference",
                "tfidf",
                lambda: tfidf_candidate(config, f"{ingest_sha256[:8]}-{config.data.seed}", frames, labels, force),
            )
        ]
        if with_lexical and config.compare.tfidf_baseline
        else []
    )
    return CandidatePool(transformers, lexical, fused, references)


def run_comparison(config: Config, design_name: str = "main", force: bool = False) -> Path:
    """Train and evaluate every candidate of the design called ``design_name``, fuse, compare and write the
    report; returns the Markdown report. Finished children are reused; ``force`` retrains and re-evaluates
    every one of them."""
    started = time.perf_counter()
    tokenize_dir = require_output(config, "tokenize")
    design = design_for(config, design_name)
    grid = variants(design)
    names = [variant_name(v) for v in grid]
    seeds = list(config.compare.seeds)
    settings = [variant_config(config, design, v, seeds[0]) for v in grid]
    if any(c.model.init == "pretrained" for c in settings) and not config.model.pretrained:
        print("compare: running the pretrain stage first (a variant starts from the pretrained encoder)")
        pretrain(config)  # the shared starting point; skipped when up to date
    if any(c.training.pseudo_labels for c in settings):  # the same extra training data for every variant
        # made once here for every variant, or said missing
        with_pseudo_labels(config.replace(training={"pseudo_labels": True}), stage="compare")
    ingest_dir = require_output(config, "ingest")
    frames = read_ingested_rows(ingest_dir, tokenize_dir)
    setup_tracking(config.tracking)
    key = comparison_key(config, design_name, design)
    parent_id = find_comparison_run_id(config.tracking, key)
    with mlflow.start_run(run_id=parent_id, run_name=None if parent_id else f"compare-{design_name}") as parent:
        parent_id = parent.info.run_id
        mlflow.set_tags(comparison_tags(key, design_name, names, seeds))
        if not parent.data.params:
            varied = {key for key, _ in design.factors} | {key for v in grid for key, _ in design.settings(v)}
            mlflow.log_params({k: v for k, v in flat_params(config).items() if k not in varied})
        pool = run_candidates(config, design, design_name, parent_id, frames, force, started)
        transformers, references = pool.transformers, pool.references
        payload = comparison_payload(
            config, design_name, design, pool, parent_id, len(frames.val), word_counts(frames.test["text"].tolist())
        )
        json_path, md_path, png_path = write_reports(payload, config.reports_dir, design.report_name)
        for path in (json_path, md_path, png_path):
            mlflow.log_artifact(str(path), "comparison")
        describe_run(parent_id, parent_description(payload))
        set_members({member.run_id: member.name for member in pool.members})  # last: a finished comparison
        log_headline_metrics(payload)
    best = payload["recommendation"]
    effects_text = "; ".join(
        f"{e['factor']} {e['a']} - {e['b']} = {e['mean_accuracy_difference'] * 100:+.2f} points "
        f"({'significant' if e['significant'] else 'not significant'})"
        for e in payload["effects"].values()
    )
    print(
        f"compare: {len(transformers)} Transformer runs, {len(pool.members) - len(transformers)} lexical and fused "
        f"candidates and {len(references)} reference on {payload['test_rows']:,} test reviews; "
        f"{effects_text or 'no factor varied'}; deploy {best['variant']} (val {best[SELECTION]:.4f}, test "
        f"{best['test_accuracy']:.4f}); wrote {md_path}, {json_path.name}, {png_path.name} in "
        f"{duration(time.perf_counter() - started)} ({len(pool.everything)} candidates)"
    )
    return md_path
