import json
import urllib.request

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.stages import compare
from pipeline.metrics import mcnemar_exact

VARIANTS = ["first_token/pretrained", "first_token/scratch", "mean/pretrained", "mean/scratch"]


def model_run_ids(payload: dict) -> list[str]:
    return [run_id for name in VARIANTS for run_id in payload["summary"][name]["run_ids"]]


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
    text = report.read_text()
    assert "## Verdict" in text and text.rstrip().endswith(".")
    # behaviour tests: one row per capability, one column per variant and the baseline
    behaviour_rows = [line for line in text.splitlines() if line.startswith("| negation |")]
    assert len(behaviour_rows) == 1 and behaviour_rows[0].count("%") == len(VARIANTS) + 1
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


def test_mlflow_server_shows_children_with_pooling_and_test_accuracy(comparison):
    from pipeline.mlflow_ui import mlflow_server

    config, _ = comparison
    with mlflow_server(config.tracking.tracking_uri) as base:
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


def test_register_picks_best_validation_run_and_score_uses_champion(comparison, tmp_path, capsys):
    from pipeline.stages import register, score

    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    uri = register.run(config)
    assert uri == "models:/smoke-sentiment@champion"
    client = mlflow.tracking.MlflowClient()
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    model_runs = model_run_ids(payload)
    val_accuracy = {run_id: client.get_run(run_id).data.metrics["best_val_accuracy"] for run_id in model_runs}
    assert champion.run_id in model_runs
    assert val_accuracy[champion.run_id] == max(val_accuracy.values())
    capsys.readouterr()
    register.run(config)
    assert "up to date" in capsys.readouterr().out

    # the model card: the version's description and reports/<run_id>/model_card.md, from the run's own numbers
    card = (config.reports_dir / champion.run_id / "model_card.md").read_text()
    assert client.get_model_version("smoke-sentiment", champion.version).description == card
    run = client.get_run(champion.run_id)
    evaluation = json.loads((config.reports_dir / champion.run_id / "metrics.json").read_text())
    accuracy = run.data.metrics["test_accuracy"]
    line = next(li for li in card.splitlines() if li.startswith("- accuracy "))
    low, high = (float(x) for x in line.split("95% CI ")[1].rstrip(")").split(" to "))
    assert line.startswith(f"- accuracy {accuracy:.4f}") and low <= accuracy <= high
    assert f"{evaluation['test_rows']:,} test reviews" in card
    assert f"cut to **{run.data.params['tokenizer.max_sequence_length']} tokens**" in card
    assert f"**{run.data.params['model.pooling']} pooling**" in card
    assert f"expected calibration error {run.data.metrics['test_ece']:.4f}" in card
    for capability, rate in evaluation["behaviour"].items():
        assert f"| {capability} | {rate:.0%} |" in card
    assert "English only" in card and "Intended use" in card

    pd.DataFrame({"text": ["superb and wonderful", "awful and dull"]}).to_csv(tmp_path / "in.csv", index=False)
    summary = score.run(config, tmp_path / "in.csv", tmp_path / "out.csv")  # default: the champion
    assert summary["scored"] == 2


def test_position_ablation_shares_runs_without_stealing_them(comparison, capsys):
    from pipeline.stages import register

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
    register.run(config)  # still registers from the pooling comparison's runs
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert champion.run_id in model_run_ids(pooling)


def test_force_retrains_every_child_and_registers_a_new_version(comparison, capsys):
    """Last in this module: --force replaces the comparison's runs (the parent stays the same)."""
    import argparse

    from pipeline.stages import register

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
    register.run(config)
    version = int(client.get_model_version_by_alias("smoke-sentiment", "champion").version)
    register.main(config, argparse.Namespace(force=True))
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


def test_compare_pair_calls_a_consistent_large_difference_significant_and_equal_models_not():
    rng = np.random.default_rng(0)
    better = rng.random((2, 2000)) < 0.9
    worse = better & (rng.random((2, 2000)) < 0.8)  # right on a subset of what `better` gets right
    labels = [{"seed": 1}, {"seed": 2}]
    assert compare.compare_pair(better, worse, labels, samples=200)["significant"] is True
    assert compare.compare_pair(better, better.copy(), labels, samples=200)["significant"] is False
    mixed = np.stack([better[0], worse[1]]), np.stack([worse[0], better[1]])  # the pairs disagree on the sign
    assert compare.compare_pair(*mixed, labels, samples=200)["significant"] is False
