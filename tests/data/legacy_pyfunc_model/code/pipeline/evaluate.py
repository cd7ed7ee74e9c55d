"""Evaluation stage: score the test split with a trained run and log ``test_`` metrics to it.

Reads:  ``data/ingest/test.parquet`` and the run's MLflow pyfunc model (its own Keras model and
        tokenizer, so the test texts go through exactly the preprocessing of training).
Writes: to the same MLflow run, ``test_*`` metrics (for more than two classes also per-class
        precision/recall/F1, macro and weighted F1, one-vs-rest ROC AUC) and plots (confusion
        matrix, ROC, reliability diagram, accuracy by review length, attention heatmaps) and
        the 50 most confident errors; ``behaviour_*`` pass rates of the CheckList-style behaviour
        tests (``pipeline.behaviour``); locally ``reports/<run_id>/`` with ``metrics.json``, the plots,
        ``errors.csv``, ``test_predictions.parquet``, ``behaviour.md`` and ``behaviour.csv``.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from pipeline import behaviour
from pipeline.artifacts import atomic_write_json, atomic_write_text
from pipeline.config import Config
from pipeline.inference import SentimentClassifier, load_classifier, predict_ids, predict_probabilities
from pipeline.metrics import classification_metrics
from pipeline.predictions import predicted_and_confidence, probability_columns
from pipeline.stages import require_output
from pipeline.text import PAD_ID
from pipeline.tracking import latest_training_run_id, setup_tracking

ATTENTION_EXAMPLES = (
    "A wonderful film with a moving story and superb acting.",
    "The plot was dull and the ending was a complete waste of time.",
    "Not bad at all, although the middle drags a little.",
)
ERROR_EXAMPLES = 50


# --------------------------------------------------------------------------- pure helpers


def length_bucket_accuracy(correct: np.ndarray, token_counts: np.ndarray, max_tokens: int) -> pd.DataFrame:
    """Accuracy per review-length bucket (tokens before truncation), marking truncated buckets.

    Buckets are relative to the cut-off: up to 1/4, 1/2 and all of ``max_tokens`` (whole
    reviews), then up to twice it, and beyond (reviews that lost tokens to truncation).
    """
    edges = sorted({0, max_tokens // 4, max_tokens // 2, max_tokens, 2 * max_tokens, 10**9})
    correct = np.asarray(correct, dtype=bool)
    rows = []
    for low, high in zip(edges[:-1], edges[1:]):
        in_bucket = (token_counts > low) & (token_counts <= high)
        if in_bucket.any():
            name = f"{low + 1}-{high}" if high < 10**9 else f">{low}"
            rows.append({"bucket": name, "reviews": int(in_bucket.sum()), "accuracy": float(correct[in_bucket].mean()),
                         "truncated": bool(low >= max_tokens)})
    return pd.DataFrame(rows)


def prediction_frame(source_files, labels: np.ndarray, probabilities: np.ndarray, names: list[str]) -> pd.DataFrame:
    """One row per test example: label, prediction, correctness, confidence and the named probabilities."""
    predicted, confidence = predicted_and_confidence(probabilities)
    return pd.DataFrame({"source_file": list(source_files), "label": np.asarray(labels), "predicted": predicted,
                         "correct": predicted == np.asarray(labels), "confidence": confidence,
                         **probability_columns(probabilities, names)})


def most_confident_errors(frame: pd.DataFrame, predictions: pd.DataFrame, names: list[str],
                          limit: int = ERROR_EXAMPLES) -> pd.DataFrame:
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

    from pipeline.plots import new_figure, save_figure

    size = max(4.5, 0.6 * len(names) + 3)
    figure, axis = new_figure(size + 0.5, size)
    ConfusionMatrixDisplay.from_predictions(labels, predicted, labels=list(range(len(names))),
                                            display_labels=names, ax=axis, colorbar=False)
    axis.set_title("Confusion matrix (test)")
    return save_figure(figure, path)


def plot_roc(labels, probabilities, names: list[str], path: Path) -> Path:
    """The ROC curve for two classes; one-vs-rest curves, one per class, for more."""
    from sklearn.metrics import RocCurveDisplay

    from pipeline.plots import new_figure, save_figure

    figure, axis = new_figure(5, 4.5)
    probabilities = np.asarray(probabilities)
    if len(names) == 2:
        RocCurveDisplay.from_predictions(labels, probabilities[:, 1], ax=axis, plot_chance_level=True)
    else:
        for index, name in enumerate(names):
            if len(np.unique(np.asarray(labels) == index)) == 2:
                RocCurveDisplay.from_predictions(np.asarray(labels) == index, probabilities[:, index], ax=axis,
                                                 name=f"{name} vs rest", plot_chance_level=index == 0)
    axis.set_title("ROC curve (test)")
    return save_figure(figure, path)


def plot_reliability(labels, probabilities, names: list[str], path: Path) -> Path:
    """Reliability of P(class 1) for two classes; of the top-label confidence for more."""
    from sklearn.calibration import CalibrationDisplay

    from pipeline.plots import new_figure, save_figure

    figure, axis = new_figure(5, 4.5)
    if len(names) == 2:
        CalibrationDisplay.from_predictions(labels, np.asarray(probabilities)[:, 1], n_bins=15, ax=axis, name="model")
        axis.set_title("Reliability diagram (test)")
    else:
        predicted, confidence = predicted_and_confidence(probabilities)
        CalibrationDisplay.from_predictions(predicted == np.asarray(labels), confidence, n_bins=15, ax=axis,
                                            name="top-label confidence")
        axis.set_title("Reliability of the predicted class (test)")
    return save_figure(figure, path)


def plot_length_buckets(buckets: pd.DataFrame, path: Path) -> Path:
    from pipeline.plots import new_figure, save_figure

    figure, axis = new_figure(7, 4)
    colors = ["tab:orange" if truncated else "tab:blue" for truncated in buckets["truncated"]]
    bars = axis.bar(buckets["bucket"], buckets["accuracy"], color=colors)
    for bar, count in zip(bars, buckets["reviews"]):
        axis.annotate(f"n={count}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=8)
    axis.set(xlabel="review length in tokens (orange: truncated)", ylabel="accuracy",
             ylim=(max(0.0, buckets["accuracy"].min() - 0.1), 1.0), title="Accuracy by review length (test)")
    return save_figure(figure, path)


def plot_attention(classifier: SentimentClassifier, pooling: str, path: Path) -> Path:
    """Heatmaps of the last block's attention (head-averaged) for a few fixed short reviews."""
    from pipeline.model import last_block_attention
    from pipeline.plots import new_figure, save_figure

    figure, axes = new_figure(width=5 * len(ATTENTION_EXAMPLES), height=5, ncols=len(ATTENTION_EXAMPLES))
    for axis, text in zip(np.atleast_1d(axes), ATTENTION_EXAMPLES):
        ids = classifier.encoder.encode([text])
        length = int((ids[0] != PAD_ID).sum())
        ids = ids[:, :length]
        tokens = [classifier.encoder.vocabulary[i] for i in ids[0]]
        scores = last_block_attention(classifier.model, ids)[0].mean(axis=0)  # [query, key]
        probabilities = predict_ids(classifier.model, ids)
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


def run_behaviour_tests(classifier: SentimentClassifier, title: str, out_dir: Path) -> dict[str, float]:
    """The behaviour suite on ``classifier``: ``behaviour.{md,csv}`` in ``out_dir``; pass rate per capability.

    Models whose labels are not negative/positive get no behaviour tests (an empty result).
    """
    if not {behaviour.NEGATIVE, behaviour.POSITIVE} <= set(classifier.labels):
        return {}
    results = behaviour.evaluate_suite(
        behaviour.build_suite(), lambda texts: predict_probabilities(classifier.model, classifier.encoder, texts),
        classifier.labels)
    atomic_write_text(out_dir / "behaviour.csv", results.to_csv(index=False))
    atomic_write_text(out_dir / "behaviour.md", behaviour.markdown_report(results, title))
    rates = behaviour.pass_rates(results)
    return {row.capability: float(row.pass_rate) for row in rates.itertuples()}


def behaviour_summary(rates: dict[str, float]) -> str:
    if not rates:
        return "no behaviour tests (labels are not negative/positive)"
    return f"behaviour tests: mean pass rate {np.mean(list(rates.values())):.0%} over {len(rates)} capabilities"


# --------------------------------------------------------------------------- stage entry point


def run(config: Config, run: str = "latest", force: bool = False) -> Path:
    """Evaluate a run on the test split; returns ``reports/<run_id>``. Skips runs already evaluated."""
    started = time.perf_counter()
    test_path = require_output(config, "ingest") / "test.parquet"
    setup_tracking(config)
    run_id = latest_training_run_id(config) if run == "latest" else run
    out_dir = config.reports_dir / run_id
    done = (out_dir / "metrics.json").is_file() and (out_dir / "test_predictions.parquet").is_file()
    if done and not force and "test_accuracy" in mlflow.get_run(run_id).data.metrics:
        print(f"evaluate: up to date, run {run_id} already evaluated ({out_dir}/metrics.json)")
        return out_dir
    classifier = load_classifier(f"runs:/{run_id}/model")
    pooling = mlflow.get_run(run_id).data.params.get("model.pooling", "first_token")

    frame = pd.read_parquet(test_path)
    labels = frame["label"].to_numpy()
    names = classifier.labels
    ids, token_counts, _ = classifier.encoder.encode_with_counts(frame["text"].tolist())
    probabilities = predict_ids(classifier.model, ids)
    metrics = classification_metrics(labels, probabilities, names)
    predictions = prediction_frame(frame["source_file"], labels, probabilities, names)
    predictions["token_count"] = token_counts
    max_tokens = classifier.encoder.settings.max_sequence_length - 1
    buckets = length_bucket_accuracy(predictions["correct"].to_numpy(), token_counts, max_tokens)

    out_dir.mkdir(parents=True, exist_ok=True)
    behaviour_rates = run_behaviour_tests(classifier, f"run {run_id} ({pooling} pooling)", out_dir)
    plots = [
        plot_confusion_matrix(labels, predictions["predicted"], names, out_dir / "confusion_matrix.png"),
        plot_roc(labels, probabilities, names, out_dir / "roc_curve.png"),
        plot_reliability(labels, probabilities, names, out_dir / "reliability.png"),
        plot_length_buckets(buckets, out_dir / "accuracy_by_length.png"),
        plot_attention(classifier, pooling, out_dir / "attention.png"),
    ]
    most_confident_errors(frame, predictions, names).to_csv(out_dir / "errors.csv", index=False)
    predictions.to_parquet(out_dir / "test_predictions.parquet", index=False)
    payload = {"run_id": run_id, "pooling": pooling, "test_rows": len(frame), "labels": names,
               "metrics": {f"test_{k}": v for k, v in metrics.items()},
               "accuracy_by_length": buckets.to_dict(orient="records"), "behaviour": behaviour_rates}
    atomic_write_json(out_dir / "metrics.json", payload)

    with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None):
        mlflow.log_metrics(payload["metrics"])
        mlflow.log_metrics({behaviour.metric_name(name): rate for name, rate in behaviour_rates.items()})
        for _, row in buckets.iterrows():
            mlflow.log_metric(f"test_accuracy_len_{row['bucket'].replace('>', 'gt')}", row["accuracy"])
        for path in plots:
            mlflow.log_artifact(str(path), "evaluation")
        for name in ("errors.csv", "metrics.json", "test_predictions.parquet", "behaviour.md", "behaviour.csv"):
            if (out_dir / name).is_file():
                mlflow.log_artifact(str(out_dir / name), "evaluation")
    print(f"evaluate: read {len(frame):,} test reviews from {test_path}; run {run_id} ({pooling}): "
          f"test_accuracy {metrics['accuracy']:.4f}, f1 {metrics['f1']:.4f}, roc_auc {metrics['roc_auc']:.4f}, "
          f"ece {metrics['ece']:.4f}; {behaviour_summary(behaviour_rates)}; "
          f"wrote {out_dir}/ in {time.perf_counter() - started:.0f}s")
    return out_dir


def main(config: Config, args) -> None:
    run(config, run=args.run, force=args.force)
