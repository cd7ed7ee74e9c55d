"""`make learning-curve`: every candidate at each size trains on the same rows, is scored on the same test rows, and
the report's statistics and choice follow the comparison's protocol (validation chooses, never test)."""

import json

import mlflow
import numpy as np
import pytest

from lab.experiments import learning_curve
from lab.experiments.learning_curve import Scored, deploy_at, merged, pairs_at, sizes_of, summarize
from pipeline.core.errors import ConfigError, InputError

CANDIDATES = ["first_token", "mean", "nbsvm", "nbsvm+first_token", "nbsvm+mean"]


def test_sizes_are_row_counts_or_all_capped_at_the_train_split():
    assert sizes_of("10, all,500", train_rows=100) == [10, 100]
    assert sizes_of("250,500", train_rows=300) == [250, 300]
    for text, message in (("10,abc", "'abc' is neither"), ("1", "cannot train"), (" , ", "names no size")):
        with pytest.raises(ConfigError, match=message):
            sizes_of(text, train_rows=100)


def scored(candidate: str, size: int, seed: int, val: float, right: int, rows: int = 200) -> Scored:
    correct = np.zeros(rows, bool)
    correct[:right] = True
    return Scored(candidate, size, seed, val, np.random.default_rng(seed).permutation(correct))


def test_the_report_chooses_on_validation_and_compares_pairs_by_the_protocol():
    """At size 100 mean is better on validation but worse on test: the choice follows validation. first_token
    right on 180 of 200 rows against mean's 100, on both seeds: a significant difference; NBSVM against the
    better pooling on validation (mean) at the same accuracy: not significant."""
    scores = []
    for seed in (1, 2):
        scores += [
            scored("first_token", 100, seed, 0.80, 180),
            scored("mean", 100, seed, 0.90, 100),
            scored("nbsvm", 100, seed, 0.85, 100),
            scored("nbsvm+first_token", 100, seed, 0.70, 150),
            scored("nbsvm+mean", 100, seed, 0.86, 100),
        ]
    summary = summarize(scores, samples=200)
    assert [row["candidate"] for row in summary] == CANDIDATES
    first = summary[0]
    assert first["mean_test_accuracy"] == pytest.approx(0.9) and first["ci_low"] < 0.9 < first["ci_high"]
    assert first["seeds"] == [1, 2]
    assert deploy_at(summary) == {100: "mean"}
    pairs = pairs_at(scores, 100, samples=200)
    assert list(pairs) == ["first_token - mean", "mean - nbsvm", "nbsvm+mean - nbsvm"]
    assert pairs["first_token - mean"]["mean_accuracy_difference"] > 0.3 and pairs["first_token - mean"]["significant"]
    assert not pairs["mean - nbsvm"]["significant"]


def test_encoders_over_the_same_reviews_share_one_report_and_one_choice_per_size(tmp_path):
    """A preset's curve joins the own encoder's (the same ingested reviews); over other reviews it starts a new
    report. The choice per size is the best on validation over every encoder (NBSVM named once)."""

    def part(val_mean: float, val_nbsvm: float) -> dict:
        return {
            "summary": [
                {"size": 100, "candidate": "mean", "mean_val_accuracy": val_mean},
                {"size": 100, "candidate": "nbsvm", "mean_val_accuracy": val_nbsvm},
            ]
        }

    path = tmp_path / "learning_curve.json"
    path.write_text(json.dumps(merged(path, "abc", "own encoder", part(0.80, 0.85))))
    report = merged(path, "abc", "preset MiniLM", part(0.90, 0.85))
    assert list(report["encoders"]) == ["own encoder", "preset MiniLM"]
    assert report["deploy"] == {"100": "mean (preset MiniLM)"}
    assert list(merged(path, "other reviews", "preset MiniLM", part(0.9, 0.8))["encoders"]) == ["preset MiniLM"]
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a readable learning-curve report"):
        merged(path, "abc", "own encoder", part(0.8, 0.85))


def test_the_curve_trains_every_candidate_on_the_same_rows_and_reports_them(prepared_config):
    config = prepared_config.replace(model={"ngram_max": 1}, training={"epochs": 2})
    report = learning_curve.run(config, sizes="24,all", seeds=(1,))
    written = json.loads(report.with_suffix(".json").read_text())
    (payload,) = written["encoders"].values()
    assert set(written["deploy"]) == {"24", "64"}
    assert [(row["size"], row["candidate"]) for row in payload["summary"]] == [
        (size, candidate) for size in (24, 64) for candidate in CANDIDATES
    ]
    assert set(payload["pairs"]) == {"24", "64"} and set(payload["deploy"]) == {"24", "64"}
    for size, chosen in payload["deploy"].items():
        at_size = [row for row in payload["summary"] if row["size"] == int(size)]
        assert chosen == max(at_size, key=lambda row: row["mean_val_accuracy"])["candidate"]
    client = mlflow.tracking.MlflowClient()
    small = [row for row in payload["summary"] if row["size"] == 24 and row["candidate"] in ("first_token", "mean")]
    for row in small:  # the Transformers trained on 24 rows, without distillation
        params = client.get_run(row["run_ids"][0]).data.params
        assert params["train_rows"] == "24" and params["training.pseudo_labels"] == "False"
    assert report.with_suffix(".png").stat().st_size > 1000
    assert "| 24 | nbsvm |" in report.read_text()
    (curve,) = client.search_runs(
        [client.get_experiment_by_name("smoke").experiment_id], "tags.pipeline_stage = 'learning_curve'"
    )
    history = client.get_metric_history(curve.info.run_id, "test_accuracy.nbsvm")
    assert [point.step for point in history] == [24, 64]
    assert {item.path for item in client.list_artifacts(curve.info.run_id, "learning_curve")} == {
        f"learning_curve/learning_curve.{suffix}" for suffix in ("json", "md", "png")
    }
