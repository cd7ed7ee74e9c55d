"""One recorder for every kind of candidate: what a producer computed, logged, evaluated and reported the same way.

A producer (``pipeline.stages.compare.producers``) computes and returns a :class:`Produced`: the model to score (or
the probabilities already computed), its parameters, its own metrics, the pyfunc artifacts to log (or none) and a few
words for the progress line. :func:`record` owns the rest, for every kind: reusing a finished run, the output folder,
the MLflow child run under the comparison, evaluation through ``pipeline.stages.evaluate.scorecard.evaluate_model``,
model logging, the metrics a comparison reports and the one-line summary. A Transformer is trained and evaluated by
the train and evaluate stages (which a user also runs alone) and recorded by them; :func:`adopt` puts its run under
the comparison and builds its :class:`Candidate` the same way.

Writes: the candidate's evaluation files into its :class:`Slot`'s folder (``reports/<kind>-...``) and one MLflow
child run per candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from pipeline.core.catalog import CROP_PREDICTIONS_FILE, TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE
from pipeline.model.classifiers import PipelineModel
from pipeline.model.logged_model import log_pipeline_model
from pipeline.stages.compare.candidates import KINDS, Candidate, summary_metrics
from pipeline.stages.evaluate import behaviour
from pipeline.stages.evaluate.scorecard import (
    EvaluatedRun,
    GivenProbabilities,
    ReviewLengths,
    evaluate_model,
    log_evaluation,
)
from pipeline.stages.tokenize.outputs import IngestedRows
from pipeline.tracking import VARIANT_TAG, adopt_child, describe_run

EVALUATED_FILES = (TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, CROP_PREDICTIONS_FILE)


@dataclass(frozen=True)
class Produced:
    """What a producer computed; plain values, no MLflow."""

    classifier: PipelineModel  # what the evaluation scores (or asks for labels and behaviour tests, with ``given``)
    params: dict[str, Any]
    metrics: dict[str, float]  # the producer's own (val_accuracy_cross_fitted, train_seconds, its choice on validation)
    summary: str  # the progress line's words before the test accuracy
    artifacts: dict[str, str] | None = None  # the pyfunc model's artifacts to log; None: no model is logged
    given: GivenProbabilities | None = None  # probabilities already computed (a fusion's, from its parts')
    lengths: ReviewLengths | None = None  # token counts for accuracy by length, for a model without a tokenizer


@dataclass(frozen=True)
class Slot:
    """Where one candidate is recorded and how a finished run of it is found again."""

    name: str  # its row in the report (``nbsvm``, ``nbsvm+mean``, ``tfidf``)
    kind: str  # a key of ``candidates.KINDS``
    seed: int | None
    out_dir: Path
    run_name: str
    tags: dict[str, str]
    find: Callable[[], Any]  # the finished MLflow run of this candidate, or None
    title: str  # the evaluation's title
    needs: tuple[str, ...] = EVALUATED_FILES  # files in ``out_dir`` a finished run must have to be reused
    settings: dict[str, str] = field(default_factory=dict)  # a Transformer's design settings (fused runs log them)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind of candidate {self.kind!r} (known: {', '.join(KINDS)})")


def read_if_present(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.is_file() else None


def slot_candidate(slot: Slot, run_id: str, metrics: dict, test, val, crops) -> Candidate:
    """The candidate recorded in ``slot``: its run, the metrics a comparison reports, its predictions."""
    return Candidate(
        slot.name,
        slot.kind,
        slot.seed,
        run_id,
        summary_metrics(metrics),
        test,
        val,
        folder=slot.out_dir,
        settings=slot.settings,
        crops=crops,
    )


def reused(slot: Slot, run) -> Candidate:
    """The candidate of a finished run, from its logged metrics and its evaluation files."""
    folder = slot.out_dir
    return slot_candidate(
        slot,
        run.info.run_id,
        run.data.metrics,
        pd.read_parquet(folder / TEST_PREDICTIONS_FILE),
        read_if_present(folder / VAL_PREDICTIONS_FILE),
        read_if_present(folder / CROP_PREDICTIONS_FILE),
    )


def record(slot: Slot, produce: Callable[[Path], Produced], frames: IngestedRows, force: bool, say=print) -> Candidate:
    """The candidate in ``slot``: a finished run reused (unless ``force``), else ``produce(out_dir)`` computed,
    then logged as a child run of the active comparison, evaluated on the test and validation reviews and their
    sentence crops, its model logged (when the producer gives artifacts) and a line printed."""
    existing = None if force else slot.find()
    if existing is not None and all((slot.out_dir / name).is_file() for name in slot.needs):
        return reused(slot, existing)
    slot.out_dir.mkdir(parents=True, exist_ok=True)
    produced = produce(slot.out_dir)
    with mlflow.start_run(run_name=slot.run_name, nested=True) as run:
        mlflow.set_tags({**slot.tags, **produced.classifier.run_tags()})
        mlflow.log_params(produced.params)
        mlflow.log_metrics(produced.metrics)
        evaluation = evaluate_model(
            produced.classifier,
            frames.test,
            frames.val,
            slot.out_dir,
            slot.title,
            produced.lengths,
            given=produced.given,
        )
        log_evaluation(evaluation, slot.out_dir)
        if produced.artifacts is not None:
            log_pipeline_model(type(produced.classifier)(), produced.artifacts)
        run_id = run.info.run_id
    payload = evaluation.payload
    metrics = {
        **payload["metrics"],
        **payload["length_metrics"],
        **{behaviour.metric_name(capability): rate for capability, rate in payload["behaviour"].items()},
        **produced.metrics,
    }
    say(f"compare: {slot.title}: {produced.summary}; test_accuracy {metrics['test_accuracy']:.4f}")
    return slot_candidate(
        slot, run_id, metrics, evaluation.predictions, evaluation.val_predictions, evaluation.crop_predictions
    )


@dataclass(frozen=True)
class TrainedCandidate:
    """A Transformer the train and evaluate stages recorded: its run, folder, evaluation and design settings."""

    name: str
    seed: int
    run_id: str
    folder: Path
    evaluated: EvaluatedRun
    settings: dict[str, str]
    max_tokens: int
    description: str  # the run's description under the comparison


def adopt(trained: TrainedCandidate, parent_id: str) -> Candidate:
    """A Transformer run as a candidate of the comparison ``parent_id``: shown under it (unless another comparison
    already holds it), named by its variant, its candidate built from its evaluation."""
    if adopt_child(trained.run_id, parent_id) == parent_id:
        describe_run(trained.run_id, trained.description)
    client = mlflow.tracking.MlflowClient()
    if VARIANT_TAG not in client.get_run(trained.run_id).data.tags:  # a run shared with another comparison keeps
        client.set_tag(trained.run_id, VARIANT_TAG, trained.name)  # its name
    evaluated = trained.evaluated
    return Candidate(
        trained.name,
        "transformer",
        trained.seed,
        trained.run_id,
        summary_metrics(evaluated.metrics),
        evaluated.predictions("test"),
        evaluated.predictions("val"),
        folder=trained.folder,
        settings=trained.settings,
        max_tokens=trained.max_tokens,
        crops=evaluated.predictions("crops"),
    )
