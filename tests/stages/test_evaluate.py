import json

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.stages import evaluate
from pipeline.stages.evaluate import behaviour
from pipeline.stages.evaluate import scorecard as evaluation


def test_length_bucket_accuracy_marks_truncated_buckets():
    correct = np.array([True, False, True, True])
    counts = np.array([10, 50, 300, 600])  # cut-off 255: buckets 63, 127, 255, 510
    buckets = evaluation.length_bucket_accuracy(correct, counts, max_tokens=255)
    assert buckets["reviews"].sum() == 4
    assert buckets.set_index("bucket")["accuracy"].to_dict() == {"1-63": 0.5, "256-510": 1.0, ">510": 1.0}
    assert buckets.set_index("bucket")["truncated"].to_dict() == {"1-63": False, "256-510": True, ">510": True}
    whole = evaluation.length_bucket_accuracy(correct, counts, max_tokens=255, truncates=False)  # read by windows
    assert whole["accuracy"].tolist() == buckets["accuracy"].tolist() and not whole["truncated"].any()


def test_most_confident_errors_are_wrong_and_sorted():
    positive, names = np.array([0.1, 0.95, 0.8, 0.6]), ["negative", "positive"]
    probabilities = np.column_stack([1 - positive, positive])
    frame = pd.DataFrame(
        {"review_id": range(4), "source_file": list("abcd"), "label": [1, 0, 1, 0], "text": ["x", "y", "z", "w"]}
    )
    predictions = evaluation.prediction_frame(frame["source_file"], frame["label"].to_numpy(), probabilities, names)
    errors = evaluation.most_confident_errors(frame, predictions, names)
    assert errors["source_file"].tolist() == ["b", "a", "d"]
    assert errors["predicted_label"].tolist() == [names[1], names[0], names[1]]


def test_prediction_frame_for_three_classes():
    probabilities = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    frame = evaluation.prediction_frame(["x", "y"], np.array([0, 1]), probabilities, ["bad", "meh", "good"])
    assert frame["predicted"].tolist() == [0, 2] and frame["correct"].tolist() == [True, False]
    assert frame["confidence"].tolist() == pytest.approx([0.7, 0.8])
    assert {"probability_bad", "probability_meh", "probability_good"} <= set(frame.columns)


def test_evaluate_logs_test_metrics_plots_and_report(trained_run):
    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    run_id = manifest["mlflow_run_id"]
    out_dir = evaluate.run(config, run="latest")
    assert out_dir == config.reports_dir / run_id
    report = json.loads((out_dir / "metrics.json").read_text())
    assert report["test_rows"] == 120
    assert report["metrics"]["test_accuracy"] > 0.85
    for key in (
        "test_precision",
        "test_recall",
        "test_f1",
        "test_roc_auc",
        "test_pr_auc",
        "test_log_loss",
        "test_brier",
        "test_ece",
    ):
        assert key in report["metrics"]
    errors = pd.read_csv(out_dir / "errors.csv")
    assert len(errors) <= 50
    assert ((errors["positive_probability"] >= 0.5).astype(int) != errors["label"]).all()
    assert (errors["predicted_label"] != errors["label_name"]).all()

    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    run = mlflow.get_run(run_id)
    assert run.data.metrics["test_accuracy"] == pytest.approx(report["metrics"]["test_accuracy"])
    artifacts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(run_id, "evaluation")}
    for name in (
        "confusion_matrix.png",
        "roc_curve.png",
        "reliability.png",
        "accuracy_by_length.png",
        "accuracy_by_words.png",
        "attention.png",
        "errors.csv",
        "metrics.json",
        "behaviour.md",
        "behaviour.csv",
        "crop_predictions.parquet",
        "confident_errors.html",
    ):
        assert f"evaluation/{name}" in artifacts
    page = (out_dir / "confident_errors.html").read_text()  # the first errors, their words coloured
    assert page.count("<section>") == min(len(errors), 12)
    if len(errors):
        assert f"labelled {errors['label_name'][0]}, predicted {errors['predicted_label'][0]}" in page
        assert "<b>Transformer</b> (" in page and "tokens read): log-odds" in page
        assert 'title="+' in page or 'title="-' in page

    # accuracy by length in words, and one sentence crop per validation and test review
    from pipeline.core.catalog import stage_dir
    from pipeline.stages.evaluate.lengths import CROP_SEED
    from pipeline.stages.ingest.outputs import read_split
    from pipeline.text.crops import crop_set, word_counts

    test, val = (read_split(stage_dir(config, "ingest"), split) for split in ("test", "val"))
    crops = pd.read_parquet(out_dir / "crop_predictions.parquet")
    expected = crop_set({"val": val, "test": test}, CROP_SEED)
    for split in ("val", "test"):
        rows = crops[crops["split"] == split]
        assert rows["source_file"].tolist() == expected[split]["source_file"].tolist()
        assert rows["words"].tolist() == word_counts(expected[split]["text"].tolist()).tolist()
        assert report["sentence_crops"][split]["accuracy"] == pytest.approx(rows["correct"].mean())
        assert (
            report["sentence_crops"][split]["ci_low"]
            <= rows["correct"].mean()
            <= report["sentence_crops"][split]["ci_high"]
        )
    assert run.data.metrics["test_crop_accuracy"] == pytest.approx(report["sentence_crops"]["test"]["accuracy"])
    assert sum(row["rows"] for row in report["accuracy_by_words"]) == len(test)
    words = word_counts(test["text"].tolist())
    predictions = pd.read_parquet(out_dir / "test_predictions.parquet")
    for row in report["accuracy_by_words"]:
        low, high = {"<=25": (0, 25), "26-80": (26, 80), "81-250": (81, 250), ">250": (251, 10**9)}[row["bucket"]]
        in_bucket = (words >= low) & (words <= high)
        assert row["rows"] == in_bucket.sum() and row["accuracy"] == pytest.approx(
            predictions["correct"][in_bucket].mean()
        )
    validation_words = np.concatenate([word_counts(val["text"].tolist()), crops.loc[crops["split"] == "val", "words"]])
    assert report["validated_min_words"] == int(np.percentile(validation_words, 1))
    assert run.data.metrics["validated_min_words"] == report["validated_min_words"]

    # behaviour tests: one pass rate per capability, the same in metrics.json, MLflow and behaviour.csv
    results = pd.read_csv(out_dir / "behaviour.csv", keep_default_na=False)
    assert set(report["behaviour"]) == set(behaviour.CAPABILITIES)
    for capability, rate in report["behaviour"].items():
        assert rate == pytest.approx(results.loc[results["capability"] == capability, "passed"].mean())
        assert run.data.metrics[behaviour.metric_name(capability)] == pytest.approx(rate)
    text = (out_dir / "behaviour.md").read_text()
    assert "| negation | MFT |" in text
    failed = results[~results["passed"]]
    if len(failed):
        assert f'"{failed.iloc[0]["text"]}"' in text


def test_evaluate_without_runs_says_train_first(prepared_config):
    with pytest.raises(ValueError, match="make train"):
        evaluate.run(prepared_config)


def test_unreadable_model_uri_is_named(trained_run):
    config, _ = trained_run
    with pytest.raises(ValueError, match="runs:/0123456789abcdef/model"):
        evaluate.run(config, run="0123456789abcdef")


class _SlowModel:
    """A lexical-like model (no Transformer inside): its first scoring takes 4 s of a fake clock, the others 1 s."""

    labels = ["negative", "positive"]
    transformer_part = None

    def __init__(self, clock):
        self.clock, self.calls = clock, []

    def probabilities(self, texts):
        self.clock[0] += 4.0 if not self.calls else 1.0
        self.calls.append(len(texts))
        return np.full((len(texts), 2), 0.5)


def test_a_large_evaluation_says_what_it_scores_and_how_long_the_rest_should_take(monkeypatch):
    def frame(rows, split):
        return pd.DataFrame(
            {
                "text": [f"Sentence one of {split} {i}. Sentence two is here. And a third." for i in range(rows)],
                "label": np.arange(rows) % 2,
                "source_file": [f"{split}/{i}.txt" for i in range(rows)],
            }
        )

    clock = [0.0]
    monkeypatch.setattr(evaluation.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(evaluation, "ANNOUNCED_ROWS", 8)
    monkeypatch.setattr(evaluation, "ANNOUNCED_SECONDS", 3.0)
    lines: list[str] = []
    model = _SlowModel(clock)
    scores = evaluation.score_splits(model, frame(8, "test"), frame(4, "val"), None, None, say=lines.append)
    assert model.calls == [8, 4, 4, 8]  # test, val, then a crop of every val and test review
    assert lines == [
        "evaluate: scoring 8 test reviews, then 4 validation reviews and 12 sentence crops",
        "evaluate: 8 test reviews in 0m04s (2 a second); the 16 validation reviews and crops left "
        "should take at most 0m08s",
    ]
    assert scores.test.shape == (8, 2) and set(scores.crops) == {"val", "test"}
    lines.clear()
    evaluation.score_splits(_SlowModel(clock), frame(7, "test"), frame(4, "val"), None, None, say=lines.append)
    assert lines[0].startswith("evaluate: 7 test reviews in ")  # too few rows to announce; slow: the estimate
    given = evaluation.GivenProbabilities(
        np.zeros((8, 2)), np.zeros((4, 2)), {"val": np.zeros((4, 2)), "test": np.zeros((8, 2))}
    )
    lines.clear()
    evaluation.score_splits(_SlowModel(clock), frame(8, "test"), frame(4, "val"), None, given, say=lines.append)
    assert lines == []  # a fused model's probabilities are given: nothing is scored
