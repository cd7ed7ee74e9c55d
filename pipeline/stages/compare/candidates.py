"""The candidates of a comparison, each kind produced the same way: a :class:`Candidate`.

A candidate is one model (or, for the TF-IDF reference row, one fitted baseline) with its MLflow run,
its test and validation predictions (``pipeline.core.predictions.prediction_frame``) and the metrics a
comparison reports. Kinds (:data:`KINDS`): ``transformer`` (one variant and seed, trained and evaluated
by ``pipeline.stages.train.fit_and_log`` and ``pipeline.stages.evaluate.scorecard``), ``lexical`` (NBSVM), ``fusion`` (a Transformer run
fused with NBSVM, its weight chosen on validation) and ``reference`` (TF-IDF, not deployable). Each
producer reuses a finished run unless forced. Writes the lexical and fused models under ``reports/``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from pipeline.config import Config
from pipeline.core.catalog import (
    CROP_PREDICTIONS_FILE,
    FUSION_FILE,
    LABELS_FILE,
    LEXICAL_MODEL_FILE,
    TEST_PREDICTIONS_FILE,
    TOKENIZER_DIR,
    VAL_PREDICTIONS_FILE,
    require_output,
)
from pipeline.core.errors import InputError
from pipeline.core.files import atomic_dump, atomic_write_json, atomic_write_parquet
from pipeline.core.logs import duration
from pipeline.core.predictions import from_probability_columns, prediction_frame
from pipeline.lexical import CropRows, class_probabilities, nbsvm_baseline, tfidf_baseline
from pipeline.metrics import classification_metrics
from pipeline.model.classifiers import FusedClassifier, LexicalClassifier
from pipeline.stages.compare.designs import Design, level_name, variant_config, variant_name
from pipeline.stages.compare.fusion_weights import EvaluatedRows, PartScores, choose_fusion
from pipeline.stages.evaluate import behaviour
from pipeline.stages.evaluate.lengths import validation_crops
from pipeline.stages.evaluate.scorecard import (
    GivenProbabilities,
    ReviewLengths,
    evaluate_model,
    evaluate_run,
    log_evaluation,
)
from pipeline.stages.ingest.outputs import read_unlabeled
from pipeline.stages.tokenize.outputs import IngestedRows
from pipeline.stages.tokenize.vocabulary import own_tokenization
from pipeline.stages.train.fit_and_log import train_model
from pipeline.stages.train.outputs import transformer_artifacts
from pipeline.text.conventions import load_labels
from pipeline.text.crops import CROP_SPLITS, word_counts
from pipeline.tracking import (
    FUSION_LEXICAL_RUN_PARAM,
    FUSION_SHORT_WEIGHT_PARAM,
    FUSION_SHORT_WORDS_PARAM,
    FUSION_TRANSFORMER_RUN_PARAM,
    FUSION_WEIGHT_PARAM,
    FUSION_WEIGHTS_TRIED_PARAM,
    MODEL_KIND_TAG,
    VARIANT_TAG,
    adopt_child,
    baseline_tags,
    describe_run,
    find_baseline_run,
    find_fusion_run,
    fusion_tags,
    log_pipeline_model,
)

SUMMARY_METRICS = ("test_accuracy", "test_f1", "test_roc_auc", "test_log_loss", "test_ece", "best_val_accuracy",
                   "train_seconds")
CROP_METRICS = ("val_crop_accuracy", "test_crop_accuracy")  # the sentence crops (``evaluate.lengths``)
NBSVM, TFIDF = "nbsvm", "tfidf"
EXAMPLE_TEXTS = ["A wonderful, moving film.", "Dull and far too long."]


@dataclass(frozen=True)
class Kind:
    """How a kind of candidate is shown: its colour in plots, what deploying it means, whether it may be deployed."""

    colour: str
    deploys_as: str
    deployable: bool = True


KINDS = {"transformer": Kind("tab:blue", "a Transformer alone"),
         "lexical": Kind("tab:green", "the NBSVM baseline alone"),
         "fusion": Kind("tab:purple", "NBSVM fused with a Transformer (one artifact)"),
         "reference": Kind("tab:gray", "a reference row", deployable=False)}
LABELS = {NBSVM: "NBSVM (1-3-gram naive-Bayes logistic regression)", TFIDF: "TF-IDF + logistic regression (reference)"}


@dataclass(frozen=True)
class Candidate:
    """One candidate run: ``name`` is its row in the report (``first_token``, ``nbsvm``, ``nbsvm+mean``, ...)."""

    name: str
    kind: str
    seed: int | None
    run_id: str
    metrics: dict[str, float]
    predictions: pd.DataFrame                      # test rows
    val_predictions: pd.DataFrame | None = None    # validation rows (the reference row has none)
    folder: Path | None = None                     # a Transformer's run folder; NBSVM's model folder
    settings: dict[str, str] = field(default_factory=dict)  # a Transformer's design settings (fused runs log them)
    max_tokens: int | None = None                  # a Transformer's token limit
    crops: pd.DataFrame | None = None              # its predictions on the sentence crops (the reference has none)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind of candidate {self.kind!r} (known: {', '.join(KINDS)})")

    @property
    def correct(self) -> np.ndarray:
        """Whether each test row was predicted right, in the test split's order."""
        return self.predictions["correct"].to_numpy(dtype=bool)


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics a comparison reports: ``SUMMARY_METRICS``, ``CROP_METRICS`` and the behaviour pass rates."""
    return {k: v for k, v in metrics.items()
            if k in SUMMARY_METRICS or k in CROP_METRICS or behaviour.capability_of(k)}


def fused_name(name: str) -> str:
    return f"{NBSVM}+{name}"


# --------------------------------------------------------------------------- Transformers


def child_description(variant: dict[str, Any], seed: int, design: str, parent_id: str) -> str:
    settings = ", ".join(f"{key}={value}" for key, value in variant.items()) or "the comparison's settings"
    return (f"**{variant_name(variant)}**, seed {seed}: one Transformer of the `{design}` comparison (parent run "
            f"`{parent_id}`), trained with {settings} and otherwise the comparison's shared settings.")


def transformer_candidate(config: Config, design: Design, variant: dict[str, Any], seed: int, parent_id: str,
                          design_name: str, force: bool) -> Candidate:
    """Train (or reuse) and evaluate one variant and seed, as a child of the comparison's parent run."""
    # a tuned level that changes the tokenizer reads a tokenization of its own (made once, beside the others)
    child_config = own_tokenization(variant_config(config, design, variant, seed), config)
    trained = train_model(child_config, force=force)
    run_id = trained.run_id
    if adopt_child(run_id, parent_id) == parent_id:
        describe_run(run_id, child_description(variant, seed, design_name, parent_id))
    client = mlflow.tracking.MlflowClient()
    if VARIANT_TAG not in client.get_run(run_id).data.tags:  # a run shared with another comparison keeps its name
        client.set_tag(run_id, VARIANT_TAG, variant_name(variant))
    evaluated = evaluate_run(child_config, run=run_id, force=force)
    settings = {key: level_name(key, value) for key, value in (*design.fixed, *variant.items(), *design.settings(variant))}
    settings.setdefault("model.pooling", child_config.model.pooling)  # what a fused champion's version is tagged with
    return Candidate(variant_name(variant), "transformer", seed, run_id, summary_metrics(evaluated.metrics),
                     evaluated.predictions("test"), evaluated.predictions("val"), folder=trained.run_dir,
                     settings=settings, max_tokens=child_config.tokenizer.max_sequence_length - 1,
                     crops=evaluated.predictions("crops"))


# --------------------------------------------------------------------------- the lexical models


def nbsvm_candidate(config: Config, key: str, frames: IngestedRows, names: list[str], ingest_sha256: str,
                    force: bool) -> Candidate:
    """Fit NBSVM (C chosen on validation), log it as a child run with its pyfunc model, or reuse a finished one."""
    out_dir = config.reports_dir / f"baseline-{NBSVM}-{key}"
    files = [out_dir / name for name in (TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, CROP_PREDICTIONS_FILE,
                                         LEXICAL_MODEL_FILE, LABELS_FILE)]
    existing = None if force else find_baseline_run(config.tracking, key, NBSVM)
    if existing is not None and all(path.is_file() for path in files):
        return Candidate(NBSVM, "lexical", None, existing.info.run_id, summary_metrics(existing.data.metrics),
                         pd.read_parquet(files[0]), pd.read_parquet(files[1]), folder=out_dir,
                         crops=pd.read_parquet(files[2]))
    settings = config.baseline
    unlabeled = (read_unlabeled(require_output(config, "ingest"), ["text"])
                 if settings.unlabeled_crops_per_review else None)
    crops = f" and {settings.crops_per_review} sentence crops of each" if settings.crops_per_review else ""
    if unlabeled is not None:
        crops += f", {settings.unlabeled_crops_per_review} of each of {len(unlabeled):,} unlabeled reviews"
    print(f"compare: fitting NBSVM on {len(frames.train):,} train reviews{crops}, C from {list(settings.nbsvm_c)} "
          "on validation ...", flush=True)
    started = time.perf_counter()
    # the validation crops break ties of C: of equals, the better on short texts
    fitted = nbsvm_baseline(frames.train, frames.val, settings.nbsvm_c, settings.ngram_max, settings.max_features,
                            settings.seed, CropRows(settings.crops_per_review, settings.crop_label_weight, unlabeled,
                                                    settings.unlabeled_crops_per_review, validation_crops(frames.val)),
                            lambda step: print(f"compare: NBSVM: {step} ({duration(time.perf_counter() - started)} "
                                               "elapsed)", flush=True))
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
        evaluation = evaluate_model(classifier, frames.test, frames.val, out_dir, "NBSVM baseline",
                                    ReviewLengths(frames.test_token_counts,
                                                  config.tokenizer.max_sequence_length - 1))
        log_evaluation(evaluation, out_dir)
        log_pipeline_model(LexicalClassifier(), LexicalClassifier.artifacts(out_dir / LEXICAL_MODEL_FILE, out_dir),
                           EXAMPLE_TEXTS)
        run_id = child.info.run_id
        metrics = {**evaluation.payload["metrics"], **evaluation.payload["length_metrics"],
                   "best_val_accuracy": fitted.val_accuracy_cross_fitted,
                   "train_seconds": fitted.fit_seconds, **{behaviour.metric_name(c): r
                                                           for c, r in evaluation.payload["behaviour"].items()}}
    print(f"compare: NBSVM C={fitted.params['nbsvm.C']:g} val_accuracy {fitted.val_accuracy:.4f} "
          f"({fitted.val_accuracy_cross_fitted:.4f} cross-fitted), test_accuracy "
          f"{metrics['test_accuracy']:.4f} ({fitted.fit_seconds:.0f}s)")
    return Candidate(NBSVM, "lexical", None, run_id, summary_metrics(metrics), evaluation.predictions,
                     evaluation.val_predictions, folder=out_dir, crops=evaluation.crop_predictions)


def tfidf_candidate(config: Config, key: str, frames: IngestedRows, names: list[str],
                    force: bool) -> Candidate:
    """The TF-IDF + logistic regression reference row (no model logged: it is not a candidate to deploy)."""
    out_dir = config.reports_dir / f"baseline-{TFIDF}-{key}"
    predictions_path = out_dir / TEST_PREDICTIONS_FILE
    existing = None if force else find_baseline_run(config.tracking, key, TFIDF)
    if existing is not None and predictions_path.is_file():
        return Candidate(TFIDF, "reference", None, existing.info.run_id, summary_metrics(existing.data.metrics),
                         pd.read_parquet(predictions_path))
    test = frames.test
    with mlflow.start_run(run_name="baseline-tfidf-logreg", nested=True) as child:
        started = time.perf_counter()
        model = tfidf_baseline(frames.train, seed=config.data.seed)
        probabilities = class_probabilities(model, test["text"].tolist(), len(names))
        val_accuracy = float((class_probabilities(model, frames.val["text"].tolist(), len(names)).argmax(axis=1)
                              == frames.val["label"].to_numpy()).mean())
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
    return Candidate(TFIDF, "reference", None, run_id, summary_metrics(metrics), predictions)


# --------------------------------------------------------------------------- fusions


def part_scores(candidate: Candidate, names: list[str]) -> PartScores:
    """A candidate's evaluated probabilities: validation, test and per crop split."""
    crops = {split: from_probability_columns(candidate.crops[candidate.crops["split"] == split], names)
             for split in CROP_SPLITS}
    return PartScores(from_probability_columns(candidate.val_predictions, names),
                      from_probability_columns(candidate.predictions, names), crops)


def evaluated_rows(frames: IngestedRows, child: Candidate) -> EvaluatedRows:
    """The validation labels and the word counts of the rows a fusion is chosen and applied on."""
    val_crops = child.crops[child.crops["split"] == "val"]
    return EvaluatedRows(frames.val["label"].to_numpy(), word_counts(frames.val["text"].tolist()),
                         word_counts(frames.test["text"].tolist()),
                         {split: child.crops.loc[child.crops["split"] == split, "words"].to_numpy()
                          for split in CROP_SPLITS},
                         val_crops["label"].to_numpy(), val_crops["review"].to_numpy())


def fusion_candidate(config: Config, key: str, child: Candidate, lexical: Candidate, frames: IngestedRows,
                     names: list[str], force: bool) -> Candidate:
    """Fuse one Transformer run with NBSVM: the weight chosen on validation, one pyfunc artifact, its own run."""
    name = fused_name(child.name)
    limit = config.compare.short_fusion_words  # a length-aware fusion's files apart from the one-weight fusion's
    out_dir = config.reports_dir / (f"fusion-{child.run_id}-{lexical.run_id}" + (f"-s{limit}" if limit else ""))
    existing = None if force else find_fusion_run(config.tracking, key, child.run_id, lexical.run_id)
    paths = [out_dir / TEST_PREDICTIONS_FILE, out_dir / VAL_PREDICTIONS_FILE, out_dir / CROP_PREDICTIONS_FILE]
    if existing is not None and all(path.is_file() for path in paths):
        return Candidate(name, "fusion", child.seed, existing.info.run_id, summary_metrics(existing.data.metrics),
                         pd.read_parquet(paths[0]), pd.read_parquet(paths[1]), crops=pd.read_parquet(paths[2]))
    tokenizer_dir = child.folder / TOKENIZER_DIR
    transformer_labels, lexical_labels = load_labels(tokenizer_dir), load_labels(lexical.folder)
    if transformer_labels != lexical_labels:
        raise InputError(f"cannot fuse run {child.run_id} (labels {transformer_labels}, {tokenizer_dir}) with "
                         f"run {lexical.run_id} (labels {lexical_labels}, {lexical.folder}): other label sets")
    for split, rows in (("predictions", "test"), ("val_predictions", "validation")):
        if not getattr(child, split)["source_file"].equals(getattr(lexical, split)["source_file"]):
            raise InputError(f"cannot fuse run {child.run_id} with run {lexical.run_id}: they were evaluated "
                             f"on different {rows} rows (other splits); rerun `make compare FORCE=1`")
    choice = choose_fusion(part_scores(child, names), part_scores(lexical, names), evaluated_rows(frames, child),
                           config.compare.fusion_weights, config.compare.short_fusion_words)
    weight, by_weight, honest = choice.weight, choice.by_weight, choice.honest
    out_dir.mkdir(parents=True, exist_ok=True)
    short_settings = ({"short_transformer_weight": choice.short_weight, "short_max_words": choice.short_max_words}
                      if choice.short_max_words else {})
    fusion_file = atomic_write_json(out_dir / FUSION_FILE, {
        "transformer_weight": weight, **short_settings, "labels": names, "transformer_run_id": child.run_id,
        "lexical_run_id": lexical.run_id})
    artifacts = {**transformer_artifacts(child.folder),
                 **FusedClassifier.lexical_artifacts(lexical.folder / LEXICAL_MODEL_FILE, tokenizer_dir, fusion_file)}
    classifier = FusedClassifier.from_artifacts(artifacts)
    with mlflow.start_run(run_name=f"fusion-{child.name}-seed{child.seed}".replace("/", "-"), nested=True) as run:
        mlflow.set_tags(fusion_tags(key, name, child.run_id, lexical.run_id))
        mlflow.log_params({FUSION_WEIGHT_PARAM: weight, FUSION_WEIGHTS_TRIED_PARAM: config.compare.fusion_weights,
                           FUSION_TRANSFORMER_RUN_PARAM: child.run_id, FUSION_LEXICAL_RUN_PARAM: lexical.run_id,
                           **({FUSION_SHORT_WEIGHT_PARAM: choice.short_weight,
                               FUSION_SHORT_WORDS_PARAM: choice.short_max_words} if short_settings else {}),
                           "training.seed": child.seed, **{f"fused.{k}": v for k, v in child.settings.items()}})
        evaluation = evaluate_model(classifier, frames.test, frames.val, out_dir, f"{name}, seed {child.seed}",
                                    ReviewLengths(frames.test_token_counts,
                                                  child.max_tokens or config.tokenizer.max_sequence_length - 1),
                                    given=GivenProbabilities(choice.test, choice.val, choice.crops))
        # what `make register` compares: the weight's choice is not scored on its own rows
        mlflow.log_metrics({"best_val_accuracy": honest, "val_accuracy_chosen_weight": by_weight[weight],
                            **{f"val_accuracy_w_{w:g}": a for w, a in by_weight.items()}})
        log_evaluation(evaluation, out_dir)
        log_pipeline_model(FusedClassifier(), artifacts, EXAMPLE_TEXTS)
        run_id = run.info.run_id
    metrics = {**evaluation.payload["metrics"], **evaluation.payload["length_metrics"], "best_val_accuracy": honest,
               **{behaviour.metric_name(c): r for c, r in evaluation.payload["behaviour"].items()}}
    short_text = (f" ({choice.short_weight:g} up to {choice.short_max_words} words)" if choice.short_max_words else "")
    print(f"compare: {name} seed {child.seed}: weight {weight:g}{short_text} on the Transformer, val_accuracy "
          f"{by_weight[weight]:.4f} at that weight ({honest:.4f} cross-fitted), test_accuracy "
          f"{metrics['test_accuracy']:.4f}")
    return Candidate(name, "fusion", child.seed, run_id, summary_metrics(metrics), evaluation.predictions,
                     evaluation.val_predictions, crops=evaluation.crop_predictions)
