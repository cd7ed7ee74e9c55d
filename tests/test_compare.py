import json
import socket
import subprocess
import sys
import time
import urllib.request

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline import compare, ingest, tokenization
from pipeline.config import load_config
from pipeline.metrics import mcnemar_exact
from tests.conftest import PROJECT_ROOT, inside, make_archive, write_imdb_tree


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    write_imdb_tree(root / "source", per_class={"train": 60, "test": 40}, seed=3)
    archive = make_archive(root / "source", root / "archive.tar.gz")
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [
        f"data.archive={archive}", f"paths.data_dir={root / 'data'}", f"paths.reports_dir={root / 'reports'}",
        f"tracking.tracking_uri={tracking_uri}", "training.epochs=2",
    ])
    with inside(root):
        ingest.run(config)
        tokenization.run(config)
        report = compare.run(config)
    return config, report


def test_report_files_and_json_fields(comparison):
    config, report = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    assert report == config.reports_dir / "comparison.md"
    assert (config.reports_dir / "comparison.png").stat().st_size > 1000
    assert set(payload["summary"]) == {"first_token", "mean", "baseline"}
    for variant in ("first_token", "mean"):
        entry = payload["summary"][variant]
        assert entry["seeds"] == [1, 2]
        assert set(entry["test_accuracy"]) == {"mean", "std", "values"}
        assert "train_seconds" in entry
    difference = payload["difference"]
    assert [s["seed"] for s in difference["mcnemar"]] == [1, 2]
    assert difference["bootstrap"]["ci_low"] <= difference["mean_accuracy_difference"] <= difference["bootstrap"]["ci_high"]
    assert isinstance(difference["significant"], bool)
    text = report.read_text()
    assert "## Verdict" in text and text.rstrip().endswith(".")
    assert ("not statistically significant" in text) != difference["significant"]


def test_json_matches_children_in_mlflow(comparison):
    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    children = mlflow.search_runs(experiment_names=[config.tracking.experiment_name], output_format="list",
                                  filter_string=f"tags.mlflow.parentRunId = '{payload['parent_run_id']}'")
    assert len(children) == 5
    by_id = {run.info.run_id: run for run in children}
    for variant in ("first_token", "mean"):
        entry = payload["summary"][variant]
        for run_id, value in zip(entry["run_ids"], entry["test_accuracy"]["values"]):
            run = by_id[run_id]
            assert run.data.params["model.pooling"] == variant
            assert run.data.metrics["test_accuracy"] == pytest.approx(value)
        assert entry["test_accuracy"]["mean"] == pytest.approx(np.mean(entry["test_accuracy"]["values"]))
    baseline = by_id[payload["summary"]["baseline"]["run_ids"][0]]
    assert baseline.data.tags["variant"] == "baseline" and "test_accuracy" in baseline.data.metrics


def test_mcnemar_uses_seed_matched_predictions(comparison):
    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    for index, seed_result in enumerate(payload["difference"]["mcnemar"]):
        correct = []
        for variant in ("first_token", "mean"):
            run_id = payload["summary"][variant]["run_ids"][index]
            predictions = pd.read_parquet(config.reports_dir / run_id / "test_predictions.parquet")
            correct.append(compare.correctness(predictions))
        expected = mcnemar_exact(*correct)
        assert seed_result["p_value"] == pytest.approx(expected["p_value"])
        assert seed_result["only_a_correct"] == expected["only_a_correct"]


def test_rerun_reuses_finished_children(comparison, capsys):
    config, _ = comparison
    before = json.loads((config.reports_dir / "comparison.json").read_text())
    compare.run(config)
    output = capsys.readouterr().out
    assert output.count("train: up to date") == 4
    after = json.loads((config.reports_dir / "comparison.json").read_text())
    assert after["parent_run_id"] == before["parent_run_id"]
    assert after["summary"]["mean"]["run_ids"] == before["summary"]["mean"]["run_ids"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mlflow_server_shows_children_with_pooling_and_test_accuracy(comparison, tmp_path):
    config, _ = comparison
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", config.tracking.tracking_uri,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        experiment = json.load(urllib.request.urlopen(
            f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name={config.tracking.experiment_name}"))
        body = json.dumps({"experiment_ids": [experiment["experiment"]["experiment_id"]],
                           "filter": "params.`model.pooling` = 'mean'", "max_results": 50}).encode()
        request = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body,
                                         headers={"Content-Type": "application/json"})
        runs = json.load(urllib.request.urlopen(request))["runs"]
        assert len(runs) == 2
        for run in runs:
            metrics = {m["key"] for m in run["data"]["metrics"]}
            tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            assert "test_accuracy" in metrics
            assert tags["pooling"] == "mean" and "mlflow.parentRunId" in tags
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_register_picks_best_validation_run_and_score_uses_champion(comparison, tmp_path, capsys):
    from pipeline import registry, score

    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    uri = registry.run(config)
    assert uri == "models:/smoke-sentiment@champion"
    client = mlflow.tracking.MlflowClient()
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    model_runs = payload["summary"]["first_token"]["run_ids"] + payload["summary"]["mean"]["run_ids"]
    val_accuracy = {run_id: client.get_run(run_id).data.metrics["best_val_accuracy"] for run_id in model_runs}
    assert champion.run_id in model_runs
    assert val_accuracy[champion.run_id] == max(val_accuracy.values())
    capsys.readouterr()
    registry.run(config)
    assert "up to date" in capsys.readouterr().out

    pd.DataFrame({"text": ["superb and wonderful", "awful and dull"]}).to_csv(tmp_path / "in.csv", index=False)
    summary = score.run(config, tmp_path / "in.csv", tmp_path / "out.csv")  # default: the champion
    assert summary["scored"] == 2


def test_position_ablation_shares_runs_without_stealing_them(comparison, capsys):
    from pipeline import registry

    config, _ = comparison
    pooling = json.loads((config.reports_dir / "comparison.json").read_text())
    report = compare.run(config, factor="position")
    assert report == config.reports_dir / "ablation_position.md"
    ablation = json.loads((config.reports_dir / "ablation_position.json").read_text())
    assert set(ablation["summary"]) == {"learned", "none", "baseline"}
    # learned + first_token (the smoke default) is exactly the pooling comparison's first_token runs
    assert ablation["summary"]["learned"]["run_ids"] == pooling["summary"]["first_token"]["run_ids"]
    assert "train: up to date" in capsys.readouterr().out
    client = mlflow.tracking.MlflowClient()
    for run_id in pooling["summary"]["first_token"]["run_ids"]:
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == pooling["parent_run_id"]
    for run_id in ablation["summary"]["none"]["run_ids"]:
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == ablation["parent_run_id"]
        assert run.data.params["model.position"] == "none"
    registry.run(config)  # still registers from the pooling comparison's runs
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert champion.run_id in pooling["summary"]["first_token"]["run_ids"] + pooling["summary"]["mean"]["run_ids"]


def test_force_retrains_every_child_and_registers_a_new_version(comparison, capsys):
    """Last in this module: --force replaces the comparison's runs (the parent stays the same)."""
    import argparse

    from pipeline import registry

    config, _ = comparison
    before = json.loads((config.reports_dir / "comparison.json").read_text())
    compare.main(config, argparse.Namespace(factor="pooling", force=True))
    output = capsys.readouterr().out
    assert "up to date" not in output and output.count("train: read") == 4
    after = json.loads((config.reports_dir / "comparison.json").read_text())
    assert after["parent_run_id"] == before["parent_run_id"]
    runs_before = set(before["summary"]["first_token"]["run_ids"] + before["summary"]["mean"]["run_ids"])
    runs_after = set(after["summary"]["first_token"]["run_ids"] + after["summary"]["mean"]["run_ids"])
    assert len(runs_after) == 4 and runs_before.isdisjoint(runs_after)
    assert after["summary"]["baseline"]["run_ids"] != before["summary"]["baseline"]["run_ids"]

    client = mlflow.tracking.MlflowClient()
    registry.run(config)
    version = int(client.get_model_version_by_alias("smoke-sentiment", "champion").version)
    registry.main(config, argparse.Namespace(force=True))
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert int(champion.version) == version + 1 and champion.run_id in runs_after
