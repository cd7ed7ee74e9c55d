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

VARIANTS = ["first_token/pretrained", "first_token/scratch", "mean/pretrained", "mean/scratch"]


def model_run_ids(payload: dict) -> list[str]:
    return [run_id for name in VARIANTS for run_id in payload["summary"][name]["run_ids"]]


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
    assert set(payload["summary"]) == set(VARIANTS) | {"baseline"}
    assert payload["variants"] == VARIANTS
    for variant in VARIANTS:
        entry = payload["summary"][variant]
        assert entry["seeds"] == [1, 2]
        assert set(entry["test_accuracy"]) == {"mean", "std", "values"}
        assert "train_seconds" in entry
    difference = payload["difference"]
    assert [(s["seed"], s["at"]) for s in difference["mcnemar"]] == [(1, "init=pretrained"), (2, "init=pretrained"),
                                                                      (1, "init=scratch"), (2, "init=scratch")]
    assert set(payload["effects"]) == {"pooling", "init"}
    inter = payload["interaction"]
    assert inter["bootstrap"]["ci_low"] <= inter["difference"] <= inter["bootstrap"]["ci_high"]
    assert payload["recommendation"]["variant"] in VARIANTS
    assert difference["bootstrap"]["ci_low"] <= difference["mean_accuracy_difference"] <= difference["bootstrap"]["ci_high"]
    assert isinstance(difference["significant"], bool)
    text = report.read_text()
    assert "## Verdict" in text and text.rstrip().endswith(".")
    pooling_verdict = text.split("## Verdict", 1)[1].split("init: pretrained minus", 1)[0]
    assert ("not statistically significant" in pooling_verdict) != difference["significant"]
    assert "Deploy `" in text


def test_json_matches_children_in_mlflow(comparison):
    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    children = mlflow.search_runs(experiment_names=[config.tracking.experiment_name], output_format="list",
                                  filter_string=f"tags.mlflow.parentRunId = '{payload['parent_run_id']}'")
    assert len(children) == 9
    by_id = {run.info.run_id: run for run in children}
    for variant in VARIANTS:
        pooling, init = variant.split("/")
        entry = payload["summary"][variant]
        for run_id, value in zip(entry["run_ids"], entry["test_accuracy"]["values"]):
            run = by_id[run_id]
            assert run.data.params["model.pooling"] == pooling and run.data.params["model.init"] == init
            assert ("pretrained_from" in run.data.tags) == (init == "pretrained")
            assert run.data.metrics["test_accuracy"] == pytest.approx(value)
        assert entry["test_accuracy"]["mean"] == pytest.approx(np.mean(entry["test_accuracy"]["values"]))
    baseline = by_id[payload["summary"]["baseline"]["run_ids"][0]]
    assert baseline.data.tags["variant"] == "baseline" and "test_accuracy" in baseline.data.metrics


def test_mcnemar_uses_seed_matched_predictions(comparison):
    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    for seed_result in payload["difference"]["mcnemar"]:
        init = seed_result["at"].split("=")[1]
        correct = []
        for pooling in ("first_token", "mean"):
            entry = payload["summary"][f"{pooling}/{init}"]
            run_id = entry["run_ids"][entry["seeds"].index(seed_result["seed"])]
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
    assert output.count("\ntrain: up to date") == 8 and output.startswith("pretrain: up to date")
    after = json.loads((config.reports_dir / "comparison.json").read_text())
    assert after["parent_run_id"] == before["parent_run_id"]
    assert model_run_ids(after) == model_run_ids(before)


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
        assert len(runs) == 4
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
    model_runs = model_run_ids(payload)
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
    # learned + first_token + scratch (the smoke default) are exactly those runs of the pooling comparison
    assert ablation["summary"]["learned"]["run_ids"] == pooling["summary"]["first_token/scratch"]["run_ids"]
    assert "train: up to date" in capsys.readouterr().out
    client = mlflow.tracking.MlflowClient()
    for run_id in pooling["summary"]["first_token/scratch"]["run_ids"]:
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == pooling["parent_run_id"]
    for run_id in ablation["summary"]["none"]["run_ids"]:
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == ablation["parent_run_id"]
        assert run.data.params["model.position"] == "none"
    registry.run(config)  # still registers from the pooling comparison's runs
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert champion.run_id in model_run_ids(pooling)


def test_force_retrains_every_child_and_registers_a_new_version(comparison, capsys):
    """Last in this module: --force replaces the comparison's runs (the parent stays the same)."""
    import argparse

    from pipeline import registry

    config, _ = comparison
    before = json.loads((config.reports_dir / "comparison.json").read_text())
    compare.main(config, argparse.Namespace(factor="pooling", force=True))
    output = capsys.readouterr().out
    assert "\ntrain: up to date" not in output and output.count("\ntrain: read") == 8
    after = json.loads((config.reports_dir / "comparison.json").read_text())
    assert after["parent_run_id"] == before["parent_run_id"]
    runs_before, runs_after = set(model_run_ids(before)), set(model_run_ids(after))
    assert len(runs_after) == 8 and runs_before.isdisjoint(runs_after)
    assert after["summary"]["baseline"]["run_ids"] != before["summary"]["baseline"]["run_ids"]

    client = mlflow.tracking.MlflowClient()
    registry.run(config)
    version = int(client.get_model_version_by_alias("smoke-sentiment", "champion").version)
    registry.main(config, argparse.Namespace(force=True))
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert int(champion.version) == version + 1 and champion.run_id in runs_after


def test_main_effects_and_interaction_on_a_known_2x2():
    """Pooling helps by 10 points with pretraining and by 0 from scratch: main effect +5, interaction +10."""
    from pipeline.config import DESIGNS

    design = DESIGNS["pooling"]
    n = 1000
    rng = np.random.default_rng(0)
    base = rng.random(n) < 0.8
    better = base.copy()
    better[np.flatnonzero(~base)[:100]] = True  # 100 more right answers = +10 points
    correct = {"first_token/pretrained": np.stack([better, better]), "mean/pretrained": np.stack([base, base]),
               "first_token/scratch": np.stack([base, base]), "mean/scratch": np.stack([base, base])}
    pooling = compare.main_effect(design, 0, correct, [1, 2], samples=200)
    assert pooling["mean_accuracy_difference"] == pytest.approx(0.05)
    assert [(s["seed"], s["at"]) for s in pooling["mcnemar"]] == [(1, "init=pretrained"), (2, "init=pretrained"),
                                                                 (1, "init=scratch"), (2, "init=scratch")]
    assert not pooling["significant"]  # the scratch pairs show no difference at all
    init = compare.main_effect(design, 1, correct, [1, 2], samples=200)
    assert init["mean_accuracy_difference"] == pytest.approx(0.05)
    inter = compare.interaction(design, correct, samples=200)
    assert inter["difference"] == pytest.approx(0.10) and inter["significant"]


def test_recommendation_uses_validation_never_test():
    summary = {"a": {"best_val_accuracy": {"mean": 0.9}, "test_accuracy": {"mean": 0.80}},
               "b": {"best_val_accuracy": {"mean": 0.8}, "test_accuracy": {"mean": 0.95}},
               "baseline": {"test_accuracy": {"mean": 0.85}}}
    best = compare.recommendation(summary, ["a", "b"])
    assert best == {"variant": "a", "best_val_accuracy": 0.9, "test_accuracy": 0.80, "baseline_test_accuracy": 0.85}
