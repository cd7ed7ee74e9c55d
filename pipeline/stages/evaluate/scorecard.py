"""Evaluating a pipeline model on the test split: metrics, plots, behaviour tests, predictions to hand on.

:func:`evaluate_model` works for every model the pipeline logs (a Transformer, the NBSVM baseline, a
fused model): ``make evaluate`` calls it for a trained run, ``make compare`` for its baselines and fused
candidates, so every candidate for ``@champion`` carries the same evaluation. It writes into ``out_dir``
``metrics.json``, ``test_predictions.parquet``, ``val_predictions.parquet`` (what fusion weights and the
champion are chosen on), ``crop_predictions.parquet`` (one sentence crop of every validation and test review:
short texts, ``pipeline.stages.evaluate.lengths``), ``errors.csv`` (the most confident mistakes) and
``confident_errors.html`` (the first of them with their words coloured by how they moved the score,
``pipeline.stages.evaluate.explained_errors``), the plots
(confusion matrix, ROC, reliability diagram, accuracy by review length in tokens and in words with the crops, and
for Transformers attention heatmaps) and the behaviour tests; :func:`log_evaluation` puts them on the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from pipeline.config import Config
from pipeline.core.catalog import (
    CROP_PREDICTIONS_FILE,
    METRICS_FILE,
    TEST_PREDICTIONS_FILE,
    VAL_PREDICTIONS_FILE,
    require_output,
    stage_dir,
    token_counts_file,
)
from pipeline.core.files import atomic_write_json, atomic_write_parquet, atomic_write_text
from pipeline.core.logs import duration
from pipeline.core.predictions import predicted_and_confidence, prediction_frame
from pipeline.metrics import classification_metrics
from pipeline.model.classifiers import PipelineModel, SentimentClassifier, load_classifier, predict_ids
from pipeline.stages.evaluate import behaviour
from pipeline.stages.evaluate.explained_errors import ERRORS_PAGE, write_errors_page
from pipeline.stages.evaluate.lengths import (
    crop_frames,
    crop_predictions,
    length_bucket_accuracy,
    length_report,
    plot_length_buckets,
    plot_word_buckets,
)
from pipeline.stages.ingest.outputs import read_split
from pipeline.text.conventions import PAD_ID
from pipeline.tracking import latest_training_run_id, setup_tracking

ATTENTION_EXAMPLES = (
    "A wonderful film with a moving story and superb acting.",
    "The plot was dull and the ending was a complete waste of time.",
    "Not bad at all, although the middle drags a little.",
)
ERROR_EXAMPLES = 50
ANNOUNCED_ROWS = 5_000  # scoring this many test reviews or more is announced first
ANNOUNCED_SECONDS = 30.0  # and when they took this long, the time the rest should take


# --------------------------------------------------------------------------- pure helpers


def most_confident_errors(
    frame: pd.DataFrame, predictions: pd.DataFrame, names: list[str], limit: int = ERROR_EXAMPLES
) -> pd.DataFrame:
    """The ``limit`` wrong predictions made with the highest confidence."""
    wrong = predictions[~predictions["correct"]].sort_values("confidence", ascending=False, kind="stable").head(limit)
    errors = frame.loc[wrong.index, ["review_id", "source_file", "label"]].copy()
    errors["label_name"] = [names[i] for i in errors["label"]]
    errors["predicted_label"] = [names[i] for i in wrong["predicted"]]
    errors["confidence"] = wrong["confidence"]
    if "positive_probability" in wrong:
        errors["positive_probability"] = wrong["positive_probability"]
    errors["text_excerpt"] = frame.loc[wrong.index, "text"].str.replace(r"\s+", " ", regex=True).str.slice(0, 300)
    return errors


# --------------------------------------------------------------------------- plots


def plot_confusion_matrix(labels, predicted, names: list[str], path: Path) -> Path:
    from sklearn.metrics import ConfusionMatrixDisplay

    from pipeline.core.plots import new_figure, save_figure

    size = max(4.5, 0.6 * len(names) + 3)
    figure, axis = new_figure(size + 0.5, size)
    ConfusionMatrixDisplay.from_predictions(
        labels, predicted, labels=list(range(len(names))), display_labels=names, ax=axis, colorbar=False
    )
    axis.set_title("Confusion matrix (test)")
    return save_figure(figure, path)


def plot_roc(labels, probabilities, names: list[str], path: Path) -> Path:
    """The ROC curve for two classes; one-vs-rest curves, one per class, for more."""
    from sklearn.metrics import RocCurveDisplay

    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure(5, 4.5)
    probabilities = np.asarray(probabilities)
    if len(names) == 2:
        RocCurveDisplay.from_predictions(labels, probabilities[:, 1], ax=axis, plot_chance_level=True)
    else:
        for index, name in enumerate(names):
            if len(np.unique(np.asarray(labels) == index)) == 2:
                RocCurveDisplay.from_predictions(
                    np.asarray(labels) == index,
                    probabilities[:, index],
                    ax=axis,
                    name=f"{name} vs rest",
                    plot_chance_level=index == 0,
                )
    axis.set_title("ROC curve (test)")
    return save_figure(figure, path)


def plot_reliability(labels, probabilities, names: list[str], path: Path) -> Path:
    """Reliability of P(class 1) for two classes; of the top-label confidence for more."""
    from sklearn.calibration import CalibrationDisplay

    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure(5, 4.5)
    if len(names) == 2:
        CalibrationDisplay.from_predictions(labels, np.asarray(probabilities)[:, 1], n_bins=15, ax=axis, name="model")
        axis.set_title("Reliability diagram (test)")
    else:
        predicted, confidence = predicted_and_confidence(probabilities)
        CalibrationDisplay.from_predictions(
            predicted == np.asarray(labels), confidence, n_bins=15, ax=axis, name="top-label confidence"
        )
        axis.set_title("Reliability of the predicted class (test)")
    return save_figure(figure, path)


def plot_attention(classifier: SentimentClassifier, pooling: str, path: Path) -> Path:
    """Heatmaps of the last block's attention (head-averaged) for a few fixed short reviews."""
    from pipeline.core.plots import new_figure, save_figure
    from pipeline.model.transformer import last_block_attention

    figure, axes = new_figure(width=5 * len(ATTENTION_EXAMPLES), height=5, ncols=len(ATTENTION_EXAMPLES))
    for axis, text in zip(np.atleast_1d(axes), ATTENTION_EXAMPLES):
        ids = classifier.text_tokenizer.encode([text])
        length = int((ids[0] != PAD_ID).sum())
        ids = ids[:, :length]
        tokens = [classifier.text_tokenizer.vocabulary[i] for i in ids[0]]
        scores = last_block_attention(classifier.model, ids)[0].mean(axis=0)  # [query, key]
        probabilities = predict_ids(classifier.model, ids, compiled=False)  # one row: no XLA compile per length
        predicted, confidence = predicted_and_confidence(probabilities)
        if pooling == "first_token":
            axis.imshow(scores[:1], aspect="auto", cmap="viridis")
            axis.set_yticks([0], ["[CLS]"])
        else:
            axis.imshow(scores, aspect="auto", cmap="viridis")
            axis.set_yticks(range(length), tokens, fontsize=7)
        axis.set_xticks(range(length), tokens, rotation=90, fontsize=7)
        axis.set_title(f"predicted {classifier.labels[int(predicted[0])]} (p={float(confidence[0]):.2f})", fontsize=9)
    figure.suptitle(f"Last encoder block attention ({pooling} pooling; rows attend to columns)")
    return save_figure(figure, path)


def run_behaviour_tests(classifier: PipelineModel, title: str, out_dir: Path) -> dict[str, float]:
    """The behaviour suite on ``classifier``: ``behaviour.{md,csv}`` in ``out_dir``; pass rate per capability.

    Models whose labels are not negative/positive get no behaviour tests (an empty result).
    """
    if not {behaviour.NEGATIVE, behaviour.POSITIVE} <= set(classifier.labels):
        return {}
    results = behaviour.evaluate_suite(behaviour.build_suite(), classifier.probabilities, classifier.labels)
    atomic_write_text(out_dir / "behaviour.csv", results.to_csv(index=False))
    atomic_write_text(out_dir / "behaviour.md", behaviour.markdown_report(results, title))
    rates = behaviour.pass_rates(results)
    return {row.capability: float(row.pass_rate) for row in rates.itertuples()}


# --------------------------------------------------------------------------- evaluating one model


@dataclass(frozen=True)
class Evaluation:
    payload: dict  # what metrics.json holds
    predictions: pd.DataFrame  # test predictions, one row per test review in order
    val_predictions: pd.DataFrame  # validation predictions
    plots: list[Path]
    crop_predictions: pd.DataFrame  # one sentence crop per validation and test review (``lengths.crop_predictions``)


@dataclass(frozen=True)
class ReviewLengths:
    """What accuracy by review length needs for a model without its own tokenizer: the test reviews' token counts
    before truncation (the tokenize stage's; None when it has none for these reviews) and the model's cut-off."""

    token_counts: np.ndarray | None
    max_tokens: int


@dataclass(frozen=True)
class GivenProbabilities:
    """``[N, k]`` probabilities already computed for the test and validation splits and their sentence crops (a fused
    model's, from its parts'), so the model need not score them again."""

    test: np.ndarray
    val: np.ndarray
    crops: dict[str, np.ndarray]  # per split of ``pipeline.text.crops.CROP_SPLITS``


@dataclass(frozen=True)
class SplitScores:
    """A model's probabilities on the test and validation reviews and their sentence crops, and the test reviews'
    token counts (from the model's own tokenizer when it has one)."""

    test: np.ndarray
    val: np.ndarray
    crops: dict[str, pd.DataFrame]  # the crops scored (``lengths.crop_frames``)
    crop_probabilities: dict[str, np.ndarray]
    token_counts: np.ndarray | None
    max_tokens: int | None
    reads_windows: bool = False


def score_splits(
    classifier: PipelineModel,
    test: pd.DataFrame,
    val: pd.DataFrame,
    lengths: ReviewLengths | None,
    given: GivenProbabilities | None,
    say=print,
) -> SplitScores:
    """Score what an evaluation reads, or take ``given``'s probabilities; a Transformer's test reviews are encoded
    once for both its scores and their token counts. Scoring a large split says so, and how long the rest should
    take once the test reviews are scored (a pretrained encoder's evaluation took 10 minutes on 2 CPU cores)."""
    token_counts, max_tokens = (lengths.token_counts, lengths.max_tokens) if lengths else (None, None)
    probabilities = given.test if given else None
    crops = crop_frames(val, test)
    crop_rows = sum(len(frame) for frame in crops.values())
    rest = len(val) + crop_rows
    if given is None and len(test) >= ANNOUNCED_ROWS:
        say(
            f"evaluate: scoring {len(test):,} test reviews, then {len(val):,} validation reviews and "
            f"{crop_rows:,} sentence crops"
        )
    started = time.perf_counter()
    transformer: Any = classifier.transformer_part  # a SentimentClassifier or None
    reads_windows = False
    if transformer is not None:
        ids, token_counts, _ = transformer.text_tokenizer.encode_with_counts(test["text"].tolist())
        max_tokens = transformer.text_tokenizer.settings.max_sequence_length - 1
        reads_windows, keras_model = transformer.reads_windows, transformer.model
        if probabilities is None and classifier is transformer and not reads_windows:
            probabilities = predict_ids(keras_model, ids)  # else below, through its windows
    if probabilities is None:
        probabilities = classifier.probabilities(test["text"].tolist())
    seconds = time.perf_counter() - started
    if given is None and seconds >= ANNOUNCED_SECONDS:
        rate = len(test) / seconds
        say(
            f"evaluate: {len(test):,} test reviews in {duration(seconds)} ({rate:,.0f} a second); the "
            f"{rest:,} validation reviews and crops left should take at most {duration(rest / rate)}"
        )
    val_probabilities = given.val if given else classifier.probabilities(val["text"].tolist())
    crop_probabilities = (
        given.crops
        if given
        else {split: classifier.probabilities(frame["text"].tolist()) for split, frame in crops.items()}
    )
    return SplitScores(
        probabilities, val_probabilities, crops, crop_probabilities, token_counts, max_tokens, reads_windows
    )


def evaluate_model(
    classifier: PipelineModel,
    test: pd.DataFrame,
    val: pd.DataFrame,
    out_dir: Path,
    title: str,
    lengths: ReviewLengths | None = None,
    pooling: str | None = None,
    given: GivenProbabilities | None = None,
) -> Evaluation:
    """Score ``test`` and ``val`` (ingest's frames) and one sentence crop of each of their reviews with
    ``classifier`` and write the evaluation to ``out_dir``.

    ``given``: already computed probabilities (a fused model's, from its parts').
    Token counts (for accuracy by length) come from the Transformer's own tokenizer when it has one, else
    from ``lengths`` (the tokenize stage's counts) when given.
    """
    names = classifier.labels
    labels = test["label"].to_numpy()
    scores = score_splits(classifier, test, val, lengths, given)
    metrics = classification_metrics(labels, scores.test, names)
    val_metrics = classification_metrics(val["label"].to_numpy(), scores.val, names)
    predictions = prediction_frame(test["source_file"], labels, scores.test, names)
    val_predictions = prediction_frame(val["source_file"], val["label"].to_numpy(), scores.val, names)
    crops = crop_predictions(scores.crops, scores.crop_probabilities, names)
    by_length = length_report(test, val, predictions["correct"].to_numpy(), crops)
    out_dir.mkdir(parents=True, exist_ok=True)
    buckets = pd.DataFrame()
    plots = [
        plot_confusion_matrix(labels, predictions["predicted"], names, out_dir / "confusion_matrix.png"),
        plot_roc(labels, scores.test, names, out_dir / "roc_curve.png"),
        plot_reliability(labels, scores.test, names, out_dir / "reliability.png"),
        plot_word_buckets(by_length, out_dir / "accuracy_by_words.png"),
    ]
    if scores.token_counts is not None and scores.max_tokens is not None:
        predictions["token_count"] = np.asarray(scores.token_counts)
        buckets = length_bucket_accuracy(
            predictions["correct"].to_numpy(),
            np.asarray(scores.token_counts),
            scores.max_tokens,
            truncates=not scores.reads_windows,
        )
        plots.append(plot_length_buckets(buckets, out_dir / "accuracy_by_length.png"))
    transformer: Any = classifier.transformer_part  # a SentimentClassifier or None
    if transformer is not None and pooling is not None:
        plots.append(plot_attention(transformer, pooling, out_dir / "attention.png"))
    behaviour_rates = run_behaviour_tests(classifier, title, out_dir)
    errors = most_confident_errors(test, predictions, names)
    errors.to_csv(out_dir / "errors.csv", index=False)
    write_errors_page(classifier, title, test, errors, out_dir / ERRORS_PAGE)
    atomic_write_parquet(predictions, out_dir / TEST_PREDICTIONS_FILE)
    atomic_write_parquet(val_predictions, out_dir / VAL_PREDICTIONS_FILE)
    atomic_write_parquet(crops, out_dir / CROP_PREDICTIONS_FILE)
    payload = {
        "title": title,
        "model_kind": classifier.kind,
        "test_rows": len(test),
        "val_rows": len(val),
        "labels": names,
        "metrics": {f"test_{k}": v for k, v in metrics.items()},
        "val_metrics": {f"val_{k}": v for k, v in val_metrics.items()},
        "accuracy_by_length": buckets.to_dict(orient="records"),
        "behaviour": behaviour_rates,
        **{key: by_length[key] for key in ("accuracy_by_words", "sentence_crops", "validated_min_words")},
        "length_metrics": by_length["metrics"],
    }
    if pooling is not None:
        payload["pooling"] = pooling
    atomic_write_json(out_dir / METRICS_FILE, payload)
    return Evaluation(payload, predictions, val_predictions, plots, crops)


def log_evaluation(evaluation: Evaluation, out_dir: Path) -> None:
    """The evaluation's metrics and files on the active MLflow run (artifact folder ``evaluation/``)."""
    payload = evaluation.payload
    mlflow.log_metrics({**payload["metrics"], **payload["length_metrics"]})
    mlflow.log_metrics({behaviour.metric_name(name): rate for name, rate in payload["behaviour"].items()})
    for row in payload["accuracy_by_length"]:
        mlflow.log_metric(f"test_accuracy_len_{row['bucket'].replace('>', 'gt')}", row["accuracy"])
    for path in evaluation.plots:
        mlflow.log_artifact(str(path), "evaluation")
    for name in (
        "errors.csv",
        ERRORS_PAGE,
        METRICS_FILE,
        TEST_PREDICTIONS_FILE,
        VAL_PREDICTIONS_FILE,
        CROP_PREDICTIONS_FILE,
        "behaviour.md",
        "behaviour.csv",
    ):
        if (out_dir / name).is_file():
            mlflow.log_artifact(str(out_dir / name), "evaluation")


def behaviour_summary(rates: dict[str, float]) -> str:
    if not rates:
        return "no behaviour tests (labels are not negative/positive)"
    return f"behaviour tests: mean pass rate {np.mean(list(rates.values())):.0%} over {len(rates)} capabilities"


# --------------------------------------------------------------------------- a logged run, evaluated


@dataclass(frozen=True)
class EvaluatedRun:
    """What evaluating a run hands on: the run, its report folder and every metric the run holds now."""

    run_id: str
    out_dir: Path
    metrics: dict[str, float]

    @classmethod
    def of(cls, run_id: str, out_dir: Path) -> EvaluatedRun:
        return cls(run_id, out_dir, dict(mlflow.tracking.MlflowClient().get_run(run_id).data.metrics))

    def predictions(self, split: str = "test") -> pd.DataFrame:
        """The run's ``test``, ``val`` or ``crops`` predictions (``pipeline.core.predictions.prediction_frame``
        columns; the crops' also ``split``, ``review``, ``words``)."""
        files = {"test": TEST_PREDICTIONS_FILE, "val": VAL_PREDICTIONS_FILE, "crops": CROP_PREDICTIONS_FILE}
        return pd.read_parquet(self.out_dir / files[split])


def evaluate_run(config: Config, run: str = "latest", force: bool = False) -> EvaluatedRun:
    """Evaluate a run (an id, or ``latest``) on the test and validation splits and log the results to it;
    skips a run already evaluated."""
    started = time.perf_counter()
    ingest_dir = require_output(config, "ingest")
    setup_tracking(config.tracking)
    run_id = latest_training_run_id(config.tracking) if run == "latest" else run
    out_dir = config.reports_dir / run_id
    done = all(
        (out_dir / name).is_file()
        for name in (METRICS_FILE, TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, CROP_PREDICTIONS_FILE)
    )
    if done and not force and "test_accuracy" in mlflow.get_run(run_id).data.metrics:
        print(f"evaluate: up to date, run {run_id} already evaluated ({out_dir}/{METRICS_FILE})")
        return EvaluatedRun.of(run_id, out_dir)
    classifier = load_classifier(f"runs:/{run_id}/model")
    pooling = mlflow.get_run(run_id).data.params.get("model.pooling")
    test = read_split(ingest_dir, "test")
    val = read_split(ingest_dir, "val")
    counts_path = stage_dir(config, "tokenize") / token_counts_file("test")  # for a model without its own tokenizer
    token_counts = np.load(counts_path) if counts_path.is_file() else None
    if token_counts is not None and len(token_counts) != len(test):
        token_counts = None  # tokenized from another ingestion
    max_tokens = config.tokenizer.max_sequence_length - 1
    title = f"run {run_id} ({classifier.kind}" + (f", {pooling} pooling)" if pooling else ")")
    evaluation = evaluate_model(
        classifier, test, val, out_dir, title, ReviewLengths(token_counts, max_tokens), pooling=pooling
    )
    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        log_evaluation(evaluation, out_dir)
    metrics = evaluation.payload["metrics"]
    print(
        f"evaluate: read {len(test):,} test and {len(val):,} validation reviews from {ingest_dir}/; run {run_id} "
        f"({classifier.kind}{', ' + pooling if pooling else ''}): test_accuracy {metrics['test_accuracy']:.4f}, "
        f"f1 {metrics['test_f1']:.4f}, roc_auc {metrics['test_roc_auc']:.4f}, ece {metrics['test_ece']:.4f}, "
        f"on sentence crops {evaluation.payload['length_metrics']['test_crop_accuracy']:.4f}; "
        f"{behaviour_summary(evaluation.payload['behaviour'])}; wrote {out_dir}/ "
        f"in {time.perf_counter() - started:.0f}s"
    )
    return EvaluatedRun.of(run_id, out_dir)
