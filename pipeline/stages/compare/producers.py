"""What each kind of candidate computes, apart from how it is recorded (``recorder.py``).

- ``transformer``: one variant and seed, trained by ``pipeline.stages.train`` and evaluated by
  ``pipeline.stages.evaluate`` (stages a user also runs alone, which record their own runs), then adopted;
- ``lexical``: NBSVM, C chosen on validation;
- ``reference``: TF-IDF + logistic regression, scored but not logged as a model (not a candidate to deploy);
- ``fusion``: a Transformer run fused with NBSVM, the weight chosen on validation, one pyfunc artifact.

Each function here builds the kind's :class:`~pipeline.stages.compare.recorder.Slot` (its folder, run name, tags and
how a finished run is found) and hands :func:`~pipeline.stages.compare.recorder.record` a producer that returns a
:class:`~pipeline.stages.compare.recorder.Produced`. Writes: NBSVM's model and the fusion's settings in their folders.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.config import CompareConfig, Config
from pipeline.core.catalog import (
    CROSS_FITTED_ROWS_FILE,
    FUSION_FILE,
    LABELS_FILE,
    LEXICAL_MODEL_FILE,
    MODEL_LABELS_DIR,
    TEST_PREDICTIONS_FILE,
    TOKENIZER_DIR,
    require_output,
)
from pipeline.core.errors import InputError
from pipeline.core.files import atomic_write_json, atomic_write_parquet
from pipeline.core.logs import duration
from pipeline.core.predictions import FusionRule, from_probability_columns
from pipeline.lexical import CropRows, NbsvmArrays, nbsvm_baseline, tfidf_baseline
from pipeline.metrics import mcnemar_exact
from pipeline.model.classifiers import FusedClassifier, LexicalClassifier
from pipeline.model.kinds.reference_classifier import FittedTextModel
from pipeline.stages.compare.candidates import NBSVM, TFIDF, Candidate, fused_name
from pipeline.stages.compare.designs import Design, level_name, variant_config, variant_name
from pipeline.stages.compare.fusion_weights import EvaluatedRows, PartScores, choose_cascade, choose_fusion
from pipeline.stages.compare.recorder import EVALUATED_FILES, Produced, Slot, TrainedCandidate, adopt, record
from pipeline.stages.evaluate.lengths import validation_crops
from pipeline.stages.evaluate.scorecard import GivenProbabilities, ReviewLengths, evaluate_run
from pipeline.stages.ingest.outputs import read_unlabeled
from pipeline.stages.tokenize.outputs import IngestedRows
from pipeline.stages.tokenize.vocabulary import own_tokenization
from pipeline.stages.train.fit_and_log import train_model
from pipeline.stages.train.outputs import transformer_artifacts
from pipeline.text.conventions import load_labels
from pipeline.text.crops import CROP_SPLITS, word_counts
from pipeline.tracking import (
    CROSS_FITTED_METRIC,
    baseline_tags,
    find_baseline_run,
    find_fusion_run,
    fusion_tags,
)

# --------------------------------------------------------------------------- Transformers


def child_description(variant: dict[str, Any], seed: int, design: str, parent_id: str) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in variant.items()) or "the comparison's settings"
    return (
        f"**{variant_name(variant)}**, seed {seed}: one Transformer of the `{design}` comparison (parent run "
        f"`{parent_id}`), trained with {settings} and otherwise the comparison's shared settings."
    )


def transformer_candidate(
    config: Config, design: Design, variant: dict[str, Any], seed: int, parent_id: str, design_name: str, force: bool
) -> Candidate:
    """Train (or reuse) and evaluate one variant and seed, as a child of the comparison's parent run."""
    # a tuned level that changes the tokenizer reads a tokenization of its own (made once, beside the others)
    child_config = own_tokenization(variant_config(config, design, variant, seed), config)
    trained = train_model(child_config, force=force)
    run_id = trained.logged_run_id()
    evaluated = evaluate_run(child_config, run=run_id, force=force)
    settings = {
        key: level_name(key, value) for key, value in (*design.fixed, *variant.items(), *design.settings(variant))
    }
    settings.setdefault("model.pooling", child_config.model.pooling)  # what a fused champion's version is tagged with
    return adopt(
        TrainedCandidate(
            variant_name(variant),
            seed,
            run_id,
            trained.run_dir,
            evaluated,
            settings,
            child_config.tokenizer.max_sequence_length - 1,
            child_description(variant, seed, design_name, parent_id),
        ),
        parent_id,
    )


# --------------------------------------------------------------------------- NBSVM and the TF-IDF reference


def fit_nbsvm(config: Config, frames: IngestedRows, names: list[str], out_dir: Path) -> Produced:
    """NBSVM fitted on the train reviews (and their sentence crops), C chosen on validation; its model in out_dir."""
    settings = config.nbsvm
    unlabeled = (
        read_unlabeled(require_output(config, "ingest"), ["text"]) if settings.unlabeled_crops_per_review else None
    )
    crops = f" and {settings.crops_per_review} sentence crops of each" if settings.crops_per_review else ""
    if unlabeled is not None:
        crops += f", {settings.unlabeled_crops_per_review} of each of {len(unlabeled):,} unlabeled reviews"
    print(
        f"compare: fitting NBSVM on {len(frames.train):,} train reviews{crops}, C from {list(settings.c_values)} "
        "on validation ...",
        flush=True,
    )
    started = time.perf_counter()
    crop_rows = CropRows(
        settings.crops_per_review,
        settings.crop_label_weight,
        unlabeled,
        settings.unlabeled_crops_per_review,
        validation_crops(frames.val),  # the validation crops break ties of C: of equals, the better on short texts
    )
    fitted = nbsvm_baseline(
        frames.train,
        frames.val,
        settings.c_values,
        settings.ngram_max,
        settings.max_features,
        settings.seed,
        crop_rows,
        lambda step: print(f"compare: NBSVM: {step} ({duration(time.perf_counter() - started)} elapsed)", flush=True),
    )
    NbsvmArrays.from_pipeline(fitted.model).save(out_dir / LEXICAL_MODEL_FILE)
    atomic_write_parquet(
        pd.DataFrame({"source_file": frames.val["source_file"].to_numpy(), "correct": fitted.val_correct_cross_fitted}),
        out_dir / CROSS_FITTED_ROWS_FILE,
    )
    atomic_write_json(out_dir / LABELS_FILE, {"labels": list(names)})
    atomic_write_json(out_dir / MODEL_LABELS_DIR / LABELS_FILE, {"labels": list(names)})  # not the whole folder
    artifacts = LexicalClassifier.artifacts(out_dir / LEXICAL_MODEL_FILE, out_dir / MODEL_LABELS_DIR)
    return Produced(
        LexicalClassifier.from_artifacts(artifacts),
        {**fitted.params, "train_rows": len(frames.train)},
        {
            **{f"val_accuracy_C_{c:g}": a for c, a in fitted.val_accuracy_by_c.items()},
            "val_accuracy_chosen_c": fitted.val_accuracy,
            CROSS_FITTED_METRIC: fitted.val_accuracy_cross_fitted,
            "train_seconds": fitted.fit_seconds,
        },
        f"C={fitted.params['nbsvm.C']:g}, val_accuracy {fitted.val_accuracy:.4f} "
        f"({fitted.val_accuracy_cross_fitted:.4f} cross-fitted), fitted in {fitted.fit_seconds:.0f}s",
        artifacts=artifacts,
        lengths=ReviewLengths(frames.test_token_counts, config.tokenizer.max_sequence_length - 1),
    )


def nbsvm_candidate(
    config: Config, key: str, frames: IngestedRows, names: list[str], ingest_sha256: str, force: bool
) -> Candidate:
    """NBSVM as a child run with its pyfunc model, or a finished one reused."""
    slot = Slot(
        NBSVM,
        NBSVM,
        None,
        config.reports_dir / f"baseline-{NBSVM}-{key}",
        "baseline-nbsvm",
        {**baseline_tags(key, NBSVM), "ingest_manifest": ingest_sha256[:16]},
        lambda: find_baseline_run(config.tracking, key, NBSVM),
        "NBSVM baseline",
        # a cascade's figure reads NBSVM's cross-fitted rows (runs recorded before them are fitted again)
        needs=(*EVALUATED_FILES, LEXICAL_MODEL_FILE, LABELS_FILE)
        + ((CROSS_FITTED_ROWS_FILE,) if config.compare.cascade_share < 1 else ()),
    )
    return record(slot, lambda out_dir: fit_nbsvm(config, frames, names, out_dir), frames, force)


def fit_tfidf(seed: int, frames: IngestedRows, names: list[str]) -> Produced:
    """TF-IDF + logistic regression fitted on the train reviews (``seed``: the data section's)."""
    started = time.perf_counter()
    model = tfidf_baseline(frames.train, seed=seed)
    classifier = FittedTextModel(model, names)
    val_accuracy = float(
        (classifier.probabilities(frames.val["text"].tolist()).argmax(axis=1) == frames.val["label"].to_numpy()).mean()
    )
    seconds = time.perf_counter() - started
    return Produced(
        classifier,
        FittedTextModel.run_params(len(frames.train)),
        {"train_seconds": seconds, "val_accuracy": val_accuracy},
        f"val_accuracy {val_accuracy:.4f}, fitted in {seconds:.0f}s",
    )


def tfidf_candidate(config: Config, key: str, frames: IngestedRows, names: list[str], force: bool) -> Candidate:
    """The TF-IDF + logistic regression reference row (no model logged: it is not a candidate to deploy)."""
    slot = Slot(
        TFIDF,
        "reference",
        None,
        config.reports_dir / f"baseline-{TFIDF}-{key}",
        "baseline-tfidf-logreg",
        baseline_tags(key, TFIDF),
        lambda: find_baseline_run(config.tracking, key, TFIDF),
        "TF-IDF reference",
        needs=(TEST_PREDICTIONS_FILE,),  # runs recorded before the reference was evaluated in full kept only these
    )
    return record(slot, lambda _: fit_tfidf(config.data.seed, frames, names), frames, force)


# --------------------------------------------------------------------------- fusions


def part_scores(candidate: Candidate, names: list[str]) -> PartScores:
    """A candidate's evaluated probabilities: validation, test and per crop split."""
    frame = candidate.crop_predictions()
    crops = {split: from_probability_columns(frame[frame["split"] == split], names) for split in CROP_SPLITS}
    return PartScores(
        from_probability_columns(candidate.val_predictions, names),
        from_probability_columns(candidate.predictions, names),
        crops,
        cross_fitted_rows(candidate),
    )


def cross_fitted_rows(candidate: Candidate) -> np.ndarray | None:
    """NBSVM's per-validation-row cross-fitted correctness (``CROSS_FITTED_ROWS_FILE``), in its validation
    predictions' order; None for a candidate without it (a Transformer, an NBSVM run recorded before it)."""
    path = candidate.folder / CROSS_FITTED_ROWS_FILE if candidate.folder else None
    if path is None or not path.is_file():
        return None
    rows = pd.read_parquet(path)
    if candidate.val_predictions is None or not rows["source_file"].equals(candidate.val_predictions["source_file"]):
        raise InputError(f"{path}: its rows are not the validation rows of run {candidate.run_id}")
    return rows["correct"].to_numpy(dtype=bool)


def evaluated_rows(frames: IngestedRows, child: Candidate) -> EvaluatedRows:
    """The validation labels and the word counts of the rows a fusion is chosen and applied on."""
    crops = child.crop_predictions()
    val_crops = crops[crops["split"] == "val"]
    return EvaluatedRows(
        frames.val["label"].to_numpy(),
        word_counts(frames.val["text"].tolist()),
        word_counts(frames.test["text"].tolist()),
        {split: crops.loc[crops["split"] == split, "words"].to_numpy() for split in CROP_SPLITS},
        val_crops["label"].to_numpy(),
        val_crops["review"].to_numpy(),
    )


def check_fusable(child: Candidate, lexical: Candidate) -> None:
    """Both parts have the same labels and were evaluated on the same test and validation rows."""
    tokenizer_dir, lexical_folder = child.run_folder() / TOKENIZER_DIR, lexical.run_folder()
    transformer_labels, lexical_labels = load_labels(tokenizer_dir), load_labels(lexical_folder)
    if transformer_labels != lexical_labels:
        raise InputError(
            f"cannot fuse run {child.run_id} (labels {transformer_labels}, {tokenizer_dir}) with "
            f"run {lexical.run_id} (labels {lexical_labels}, {lexical_folder}): other label sets"
        )
    for split, rows in (("predictions", "test"), ("val_predictions", "validation")):
        if not getattr(child, split)["source_file"].equals(getattr(lexical, split)["source_file"]):
            raise InputError(
                f"cannot fuse run {child.run_id} with run {lexical.run_id}: they were evaluated "
                f"on different {rows} rows (other splits); rerun `make compare FORCE=1`"
            )


def fusion_suffix(compare: CompareConfig) -> str:
    """What sets a fusion's key and folder apart: a length-aware fusion's limit and a cascade's share (none: as before
    them)."""
    limit, share = compare.short_fusion_words, compare.cascade_share
    # a cascade's share is chosen up to the budget (``-c<share>`` named a fixed share, figured before NBSVM's rows
    # were cross-fitted)
    return (f"-s{limit}" if limit else "") + (f"-upto{share:g}" if share < 1 else "")


def fuse(
    config: Config, child: Candidate, lexical: Candidate, frames: IngestedRows, names: list[str], out_dir: Path
) -> Produced:
    """The fusion's weight chosen on validation (and a short texts' weight when configured), and a cascade's threshold
    when ``compare.cascade_share`` is below 1; ``fusion.json``."""
    check_fusable(child, lexical)
    lexical_scores, rows = part_scores(lexical, names), evaluated_rows(frames, child)
    choice = choose_fusion(
        part_scores(child, names),
        lexical_scores,
        rows,
        config.compare.fusion_weights,
        config.compare.short_fusion_words,
    )
    budget = config.compare.cascade_share
    cascaded = (
        choose_cascade(choice, lexical_scores, rows, budget, config.compare.champion_tolerance) if budget < 1 else None
    )
    weight, by_weight = choice.weight, choice.by_weight
    rule = FusionRule(weight, choice.short_weight, choice.short_max_words, cascaded.threshold if cascaded else None)
    runs = (child.run_id, lexical.run_id)
    fusion_file = atomic_write_json(
        out_dir / FUSION_FILE, FusedClassifier.settings(rule, names, runs, cascaded.share if cascaded else None)
    )
    child_folder = child.run_folder()
    tokenizer_dir = child_folder / TOKENIZER_DIR
    artifacts = {
        **transformer_artifacts(child_folder),
        **FusedClassifier.lexical_artifacts(lexical.run_folder() / LEXICAL_MODEL_FILE, tokenizer_dir, fusion_file),
    }
    short_text = f" ({choice.short_weight:g} up to {choice.short_max_words} words)" if choice.short_max_words else ""
    summary = (
        f"weight {weight:g}{short_text} on the Transformer, val_accuracy {by_weight[weight]:.4f} at that weight "
        f"({choice.honest:.4f} cross-fitted)"
    )
    cascade_figures: dict[str, float] = {}
    if cascaded:
        test_labels = frames.test["label"].to_numpy()
        every_text, gated = choice.test.argmax(axis=1), cascaded.choice.test.argmax(axis=1)
        p_value = mcnemar_exact(gated == test_labels, every_text == test_labels)["p_value"]
        cascade_figures = {
            **{f"cascade_share_{name}": value for name, value in cascaded.routed.items()},
            **{f"val_accuracy_cross_fitted_share_{s:g}": figures[0] for s, figures in cascaded.by_share.items()},
            **{f"val_crops_accuracy_share_{s:g}": figures[1] for s, figures in cascaded.by_share.items()},
            "val_accuracy_cross_fitted_every_text": choice.honest,
            "test_accuracy_every_text": float((every_text == test_labels).mean()),
            "cascade_test_labels_changed": float((gated != every_text).sum()),
            "cascade_test_mcnemar_p": p_value,
        }
        summary += (
            f"; a cascade (share {cascaded.share:g}, the smallest of {min(cascaded.by_share):g}-"
            f"{max(cascaded.by_share):g} within {config.compare.champion_tolerance:.1%} of reading every text): the "
            f"Transformer reads {cascaded.routed['test']:.0%} of the test reviews (NBSVM confidence "
            f"<= {cascaded.threshold:.4f}), cross-fitted {cascaded.choice.honest:.4f}, test "
            f"{(gated == test_labels).mean():.4f} against {cascade_figures['test_accuracy_every_text']:.4f} reading "
            f"every text (McNemar p = {p_value:.2g})"
        )
        choice = cascaded.choice
    return Produced(
        FusedClassifier.from_artifacts(artifacts),
        {
            **FusedClassifier.run_params(
                rule,
                config.compare.fusion_weights,
                runs,
                (cascaded.share, list(cascaded.by_share), config.compare.champion_tolerance) if cascaded else None,
            ),
            "training.seed": child.seed,
            **{f"fused.{k}": v for k, v in child.settings.items()},
        },
        # what `make register` compares: the weight's choice is not scored on its own rows
        {
            CROSS_FITTED_METRIC: choice.honest,
            "val_accuracy_chosen_weight": by_weight[weight],
            **{f"val_accuracy_w_{w:g}": a for w, a in by_weight.items()},
            **cascade_figures,
        },
        summary,
        artifacts=artifacts,
        given=GivenProbabilities(choice.test, choice.val, choice.crops),
        lengths=ReviewLengths(frames.test_token_counts, child.max_tokens or config.tokenizer.max_sequence_length - 1),
    )


def fusion_candidate(
    config: Config, key: str, child: Candidate, lexical: Candidate, frames: IngestedRows, names: list[str], force: bool
) -> Candidate:
    """Fuse one Transformer run with NBSVM: its own run and one pyfunc artifact, or a finished one reused."""
    name = fused_name(child.name)
    slot = Slot(
        name,
        "fusion",
        child.seed,
        config.reports_dir / (f"fusion-{child.run_id}-{lexical.run_id}" + fusion_suffix(config.compare)),
        f"fusion-{child.name}-seed{child.seed}".replace("/", "-"),
        fusion_tags(key, name, child.run_id, lexical.run_id),
        lambda: find_fusion_run(config.tracking, key, child.run_id, lexical.run_id),
        f"{name}, seed {child.seed}",
    )
    return record(slot, lambda out_dir: fuse(config, child, lexical, frames, names, out_dir), frames, force)
