import json
import urllib.request

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.metrics import best_fusion_weight, compare_pair, mcnemar_exact
from pipeline.stages import compare
from pipeline.stages.compare import effects, report
from pipeline.stages.compare.candidates import Candidate
from pipeline.stages.compare.designs import Design, design_for, variant_config
from pipeline.stages.compare.producers import fusion_candidate
from pipeline.stages.compare.runner import comparison_key
from tests.served_model import invoke, model_server

VARIANTS = ["first_token", "mean"]
FUSED = [f"nbsvm+{name}" for name in VARIANTS]
CANDIDATES = VARIANTS + ["nbsvm"] + FUSED  # what `make register` chooses from; tfidf is a reference row


def review_words(config) -> np.ndarray:
    """Words per test review of the comparison's ingestion."""
    from pipeline.core.catalog import stage_dir
    from pipeline.stages.ingest.outputs import read_split
    from pipeline.text.crops import word_counts

    return word_counts(read_split(stage_dir(config, "ingest"), "test", columns=["text"])["text"].tolist())


def model_run_ids(payload: dict) -> list[str]:
    return [run_id for name in VARIANTS for run_id in payload["summary"][name]["run_ids"]]


def test_report_files_and_json_fields(comparison):
    config, report = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    assert report == config.reports_dir / "comparison.md"
    assert (config.reports_dir / "comparison.png").stat().st_size > 1000
    assert set(payload["summary"]) == set(CANDIDATES) | {"tfidf"}
    assert payload["variants"] == VARIANTS and payload["candidates"] == CANDIDATES + ["tfidf"]
    assert {payload["summary"][name]["kind"] for name in FUSED} == {"fusion"}
    assert payload["summary"]["nbsvm"]["kind"] == "nbsvm" and payload["summary"]["tfidf"]["kind"] == "reference"
    assert set(payload["fusion_effects"]) == {"pooling (fused)"}
    assert {(e["a"], e["b"]) for e in payload["versus"]} >= {(payload["recommendation"]["best_transformer"], "nbsvm")}
    for variant in VARIANTS:
        entry = payload["summary"][variant]
        assert entry["seeds"] == [1, 2]
        assert set(entry["test_accuracy"]) == {"mean", "std", "values"}
        assert "train_seconds" in entry
    difference = payload["difference"]
    assert [s["seed"] for s in difference["mcnemar"]] == [1, 2] and not any("at" in s for s in difference["mcnemar"])
    assert set(payload["effects"]) == {"pooling"} and payload["interaction"] is None  # one factor: no interaction
    assert payload["recommendation"]["variant"] in CANDIDATES
    val = {name: payload["summary"][name]["selection_val_accuracy"]["mean"] for name in CANDIDATES}
    assert val[payload["recommendation"]["variant"]] >= max(val.values()) - config.compare.champion_tolerance - 1e-12
    assert (
        difference["bootstrap"]["ci_low"]
        <= difference["mean_accuracy_difference"]
        <= difference["bootstrap"]["ci_high"]
    )
    text = report.read_text()
    assert "## Verdict" in text and text.rstrip().endswith(".")
    # behaviour tests: one row per capability, one column per variant and the baseline
    behaviour_rows = [line for line in text.splitlines() if line.startswith("| negation |")]
    assert len(behaviour_rows) == 1 and behaviour_rows[0].count("%") == len(CANDIDATES) + 1
    pooling_verdict = text.split("## Verdict", 1)[1].split("pooling (inside the fusion): first_token minus", 1)[0]
    assert ("Not significant" in pooling_verdict) != difference["significant"]
    assert "## Fusion weights (chosen on validation)" in text
    assert "Deploy `" in text
    # accuracy by length in words and on the crops: every candidate, the reference too (one recorder evaluates all)
    lengths, words = payload["lengths"], review_words(config)
    assert set(lengths) == set(CANDIDATES) | {"tfidf"}
    for name in [*CANDIDATES, "tfidf"]:
        assert lengths[name]["test crops"]["rows"] == payload["test_rows"]
        assert lengths[name]["val crops"]["rows"] == payload["val_rows"]
        assert sum(row["rows"] for key, row in lengths[name].items() if "crops" not in key) == payload["test_rows"]
        assert lengths[name]["test crops"]["accuracy"] == pytest.approx(
            payload["summary"][name]["test_crop_accuracy"]["mean"]
        )
    nbsvm = pd.read_parquet(next(config.reports_dir.glob("baseline-nbsvm-*/test_predictions.parquet")))["correct"]
    for bucket, rows in (("<=25", words <= 25), ("26-80", (words > 25) & (words <= 80))):
        if rows.any():
            assert lengths["nbsvm"][bucket]["accuracy"] == pytest.approx(nbsvm[rows].mean())
    table = text.split("## Accuracy by length and on short texts", 1)[1].split("##", 1)[0]
    assert "noisy" in table and f"test crops (n={payload['test_rows']:,})" in table
    assert sum(line.startswith("| ") for line in table.splitlines()) == len(CANDIDATES) + 3  # header, rule, tfidf


def test_json_matches_children_in_mlflow(comparison):
    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    children = mlflow.search_runs(
        experiment_names=[config.tracking.experiment_name],
        output_format="list",
        filter_string=f"tags.mlflow.parentRunId = '{payload['parent_run_id']}'",
    )
    assert len(children) == 4 + 1 + 4 + 1  # Transformers, NBSVM, one fused model per Transformer run, TF-IDF
    by_id = {run.info.run_id: run for run in children}
    for pooling in VARIANTS:
        entry = payload["summary"][pooling]
        for run_id, value in zip(entry["run_ids"], entry["test_accuracy"]["values"]):
            run = by_id[run_id]
            assert run.data.params["model.pooling"] == pooling and run.data.params["model.init"] == "scratch"
            assert "pretrained_from" not in run.data.tags
            assert run.data.metrics["test_accuracy"] == pytest.approx(value)
        assert entry["test_accuracy"]["mean"] == pytest.approx(np.mean(entry["test_accuracy"]["values"]))
    nbsvm = by_id[payload["summary"]["nbsvm"]["run_ids"][0]]
    assert nbsvm.data.tags["variant"] == "nbsvm" and nbsvm.data.tags["model_kind"] == "nbsvm"
    assert float(nbsvm.data.params["nbsvm.C"]) in config.nbsvm.c_values
    for name in FUSED:
        for run_id, seed in zip(payload["summary"][name]["run_ids"], payload["summary"][name]["seeds"]):
            run = by_id[run_id]
            transformer = payload["summary"][name.split("+", 1)[1]]
            assert run.data.params["fusion.transformer_run"] == transformer["run_ids"][transformer["seeds"].index(seed)]
            assert run.data.params["fusion.lexical_run"] == nbsvm.info.run_id
            assert 0.0 <= float(run.data.params["fusion.transformer_weight"]) <= 1.0
    assert "test_accuracy" in by_id[payload["summary"]["tfidf"]["run_ids"][0]].data.metrics


def test_mcnemar_uses_seed_matched_predictions(comparison):
    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    for seed_result in payload["difference"]["mcnemar"]:
        correct = []
        for pooling in ("first_token", "mean"):
            entry = payload["summary"][pooling]
            run_id = entry["run_ids"][entry["seeds"].index(seed_result["seed"])]
            predictions = pd.read_parquet(config.reports_dir / run_id / "test_predictions.parquet")
            correct.append(predictions["correct"].to_numpy(dtype=bool))
        expected = mcnemar_exact(*correct)
        assert seed_result["p_value"] == pytest.approx(expected["p_value"])
        assert seed_result["only_a_correct"] == expected["only_a_correct"]


def test_rerun_reuses_finished_children(own_comparison, capsys):
    config, _ = own_comparison
    before = json.loads((config.reports_dir / "comparison.json").read_text())
    compare.run(config)
    output = capsys.readouterr().out
    assert output.count("train: up to date") == 4 and "pretrain" not in output  # one init: nothing to pretrain
    assert "fitting NBSVM" not in output  # the baseline and the fused runs are reused too
    after = json.loads((config.reports_dir / "comparison.json").read_text())
    assert after["parent_run_id"] == before["parent_run_id"]
    assert model_run_ids(after) == model_run_ids(before)


def test_mlflow_server_shows_children_with_pooling_and_test_accuracy(comparison):
    from pipeline.stages.ui.links import mlflow_server

    config, _ = comparison
    with mlflow_server(config.tracking.tracking_uri) as base:
        experiment = json.load(
            urllib.request.urlopen(
                f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name={config.tracking.experiment_name}"
            )
        )
        body = json.dumps(
            {
                "experiment_ids": [experiment["experiment"]["experiment_id"]],
                "filter": "params.`model.pooling` = 'mean'",
                "max_results": 50,
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"}
        )
        runs = json.load(urllib.request.urlopen(request))["runs"]
    assert len(runs) == 2
    for run in runs:
        metrics = {m["key"] for m in run["data"]["metrics"]}
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        assert "test_accuracy" in metrics
        assert tags["pooling"] == "mean" and "mlflow.parentRunId" in tags


def test_position_ablation_shares_runs_without_stealing_them(own_comparison, capsys):
    from pipeline.stages import register

    config, _ = own_comparison
    pooling = json.loads((config.reports_dir / "comparison.json").read_text())
    report = compare.run(config.replace(compare={"seeds": [2]}), design="position")  # one seed: one new run
    assert report == config.reports_dir / "ablation_position.md"
    ablation = json.loads((config.reports_dir / "ablation_position.json").read_text())
    assert set(ablation["summary"]) == {"learned", "none"}  # an ablation: no baselines or fused candidates
    # learned + first_token (the smoke default) is exactly that seed's run of the pooling comparison
    assert ablation["summary"]["learned"]["run_ids"] == pooling["summary"]["first_token"]["run_ids"][1:]
    assert len(ablation["summary"]["none"]["run_ids"]) == 1
    assert "train: up to date" in capsys.readouterr().out
    client = mlflow.tracking.MlflowClient()
    for run_id in pooling["summary"]["first_token"]["run_ids"]:
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == pooling["parent_run_id"]
    for run_id in ablation["summary"]["none"]["run_ids"]:
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.parentRunId"] == ablation["parent_run_id"]
        assert run.data.params["model.position"] == "none"
    register.run(config)  # still registers from the main comparison's runs
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert champion.run_id in [run_id for name in CANDIDATES for run_id in pooling["summary"][name]["run_ids"]]


def test_force_retrains_every_child_of_a_one_variant_comparison_and_registers_a_new_version(smoke_config, capsys):
    """--force replaces a comparison's runs (the parent stays the same), here one variant from a pretrained backbone
    (the comparison runs `make pretrain` first) and its fused run; its own folder, not the shared fixture."""
    import argparse

    from pipeline.stages import ingest, register, tokenize

    config = smoke_config.replace(
        training={"epochs": 1},
        pretrain={"max_steps": 10},
        compare={"poolings": ["first_token"], "inits": ["pretrained"], "seeds": [1], "tfidf_baseline": False},
    )
    ingest.run(config)
    tokenize.run(config)
    capsys.readouterr()
    before = json.loads(compare.run(config).with_suffix(".json").read_text())
    first = capsys.readouterr().out
    assert first.index("pretrain: read") < first.index("\ntrain: read")  # the variant's starting point, made first
    compare.main(config, argparse.Namespace(design="main", force=True))
    output = capsys.readouterr().out
    assert "\ntrain: up to date" not in output and output.count("\ntrain: read") == 1
    after = json.loads((config.reports_dir / "comparison.json").read_text())
    assert after["parent_run_id"] == before["parent_run_id"]
    assert after["candidates"] == ["transformer", "nbsvm", "nbsvm+transformer"]
    for name in after["candidates"]:  # every child is new
        assert set(after["summary"][name]["run_ids"]).isdisjoint(before["summary"][name]["run_ids"]), name
    client = mlflow.tracking.MlflowClient()
    transformer = client.get_run(after["summary"]["transformer"]["run_ids"][0])
    assert transformer.data.params["model.init"] == "pretrained" and "pretrained_from" in transformer.data.tags

    register.run(config)
    version = int(client.get_model_version_by_alias("smoke-sentiment", "champion").version)
    register.main(config, argparse.Namespace(force=True))
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    candidates_after = {run_id for name in after["candidates"] for run_id in after["summary"][name]["run_ids"]}
    assert int(champion.version) == version + 1 and champion.run_id in candidates_after


def test_main_effects_and_interaction_on_a_known_2x2():
    """Pooling helps by 10 points with pretraining and by 0 from scratch: main effect +5, interaction +10."""
    design = Design(
        (("model.pooling", ("first_token", "mean")), ("model.init", ("pretrained", "scratch"))),
        "comparison",
        champion_pool=True,
    )
    n = 1000
    rng = np.random.default_rng(0)
    base = rng.random(n) < 0.8
    better = base.copy()
    better[np.flatnonzero(~base)[:100]] = True  # 100 more right answers = +10 points
    correct = {
        "first_token/pretrained": np.stack([better, better]),
        "mean/pretrained": np.stack([base, base]),
        "first_token/scratch": np.stack([base, base]),
        "mean/scratch": np.stack([base, base]),
    }
    pooling = effects.main_effect(design, 0, correct, [1, 2], samples=200)
    assert pooling["mean_accuracy_difference"] == pytest.approx(0.05)
    assert [(s["seed"], s["at"]) for s in pooling["mcnemar"]] == [
        (1, "init=pretrained"),
        (2, "init=pretrained"),
        (1, "init=scratch"),
        (2, "init=scratch"),
    ]
    assert not pooling["significant"]  # the scratch pairs show no difference at all
    init = effects.main_effect(design, 1, correct, [1, 2], samples=200)
    assert init["mean_accuracy_difference"] == pytest.approx(0.05)
    inter = effects.interaction(design, correct, samples=200)
    assert inter["difference"] == pytest.approx(0.10) and inter["significant"]


def test_recommendation_uses_validation_never_test():
    summary = {
        "a": {"kind": "transformer", "selection_val_accuracy": {"mean": 0.9}, "test_accuracy": {"mean": 0.80}},
        "b": {"kind": "transformer", "selection_val_accuracy": {"mean": 0.8}, "test_accuracy": {"mean": 0.95}},
        "nbsvm+a": {"kind": "fusion", "selection_val_accuracy": {"mean": 0.91}, "test_accuracy": {"mean": 0.85}},
        "nbsvm": {"kind": "nbsvm", "selection_val_accuracy": {"mean": 0.88}, "test_accuracy": {"mean": 0.99}},
    }
    best = effects.recommendation(summary, ["a", "b", "nbsvm", "nbsvm+a"], tolerance=0.003)
    assert best == {
        "variant": "nbsvm+a",
        "kind": "fusion",
        "selection_val_accuracy": 0.91,
        "test_accuracy": 0.85,
        "tolerance": 0.003,
        "best_transformer": "a",
        "best_transformer_test_accuracy": 0.80,
        "baseline_test_accuracy": 0.99,
    }
    assert "Deploy `nbsvm+a`, NBSVM fused with a Transformer" in report.deploy_sentence(best)


def test_recommendation_chooses_on_the_validation_crops_among_candidates_close_on_reviews():
    def entry(kind, val, crops, test_crops):
        return {
            "kind": kind,
            "selection_val_accuracy": {"mean": val},
            "test_accuracy": {"mean": 0.9},
            "val_crop_accuracy": {"mean": crops},
            "test_crop_accuracy": {"mean": test_crops},
        }

    summary = {
        "a": entry("transformer", 0.905, 0.80, 0.10),
        "nbsvm+a": entry("fusion", 0.91, 0.74, 0.99),
        "nbsvm": entry("nbsvm", 0.908, 0.76, 0.20),
        "tfidf": entry("reference", 0.95, 0.95, 0.99),
    }
    best = effects.recommendation(summary, list(summary), tolerance=0.003)
    assert (best["variant"], best["val_crop_accuracy"], best["test_crop_accuracy"]) == ("nbsvm", 0.76, 0.20)
    assert effects.recommendation(summary, list(summary), tolerance=0.01)["variant"] == "a"
    assert effects.recommendation(summary, list(summary), tolerance=0.0)["variant"] == "nbsvm+a"
    sentence = report.deploy_sentence(best)
    assert "within 0.3 points of the best mean validation accuracy" in sentence and "0.7600" in sentence


def test_compare_pair_calls_a_consistent_large_difference_significant_and_equal_models_not():
    rng = np.random.default_rng(0)
    better = rng.random((2, 2000)) < 0.9
    worse = better & (rng.random((2, 2000)) < 0.8)  # right on a subset of what `better` gets right
    labels = [{"seed": 1}, {"seed": 2}]
    assert compare_pair(better, worse, labels, samples=200)["significant"] is True
    assert compare_pair(better, better.copy(), labels, samples=200)["significant"] is False
    mixed = np.stack([better[0], worse[1]]), np.stack([worse[0], better[1]])  # the pairs disagree on the sign
    assert compare_pair(*mixed, labels, samples=200)["significant"] is False


def test_fused_probabilities_are_a_weighted_logit_average():
    from pipeline.model.classifiers import fuse_probabilities

    transformer = np.array([[0.2, 0.8], [0.9, 0.1]])
    lexical = np.array([[0.6, 0.4], [0.3, 0.7]])
    np.testing.assert_allclose(fuse_probabilities(transformer, lexical, 1.0), transformer, atol=1e-6)
    np.testing.assert_allclose(fuse_probabilities(transformer, lexical, 0.0), lexical, atol=1e-6)
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    fused = fuse_probabilities(transformer, lexical, 0.3)[:, 1]
    expected = 1 / (1 + np.exp(-(0.3 * logit(transformer[:, 1]) + 0.7 * logit(lexical[:, 1]))))
    np.testing.assert_allclose(fused, expected, atol=1e-6)
    with pytest.raises(ValueError, match="shapes"):
        fuse_probabilities(transformer, lexical[:1], 0.5)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        fuse_probabilities(transformer, lexical, 1.5)


def test_the_fusion_weight_is_the_best_on_validation_of_the_grid():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    noisy = lambda flip: np.where(rng.random(400) < flip, 1 - labels, labels)  # noqa: E731

    def as_probabilities(guess, sure):
        return np.stack(
            [
                np.where(guess == 0, sure, 1 - sure),
                np.where(guess == 1, sure, 1 - sure),
            ],
            axis=1,
        )

    transformer = as_probabilities(noisy(0.3), 0.7)
    lexical = as_probabilities(noisy(0.1), 0.9)
    weight, by_weight, honest = best_fusion_weight(transformer, lexical, labels, steps=11)
    assert len(by_weight) == 11 and by_weight[weight] == max(by_weight.values())
    assert by_weight[weight] >= max(by_weight[0.0], by_weight[1.0])
    assert honest <= by_weight[weight]  # choosing and scoring on different halves: no optimism


def test_fusing_models_of_other_label_sets_is_refused_naming_both(tmp_path, smoke_config):
    import dataclasses

    from pipeline.core.errors import InputError
    from pipeline.core.files import atomic_write_json

    (tmp_path / "run" / "tokenizer").mkdir(parents=True)
    atomic_write_json(tmp_path / "run" / "tokenizer" / "labels.json", {"labels": ["negative", "positive"]})
    atomic_write_json(tmp_path / "lexical" / "labels.json", {"labels": ["bad", "good"]})
    frame = pd.DataFrame({"source_file": ["a", "b"], "correct": [True, False]})
    child = Candidate("mean", "transformer", 1, "transformer-run", {}, frame, frame, folder=tmp_path / "run")
    lexical = Candidate("nbsvm", "nbsvm", None, "lexical-run", {}, frame, frame, folder=tmp_path / "lexical")
    with pytest.raises(InputError, match="cannot fuse run transformer-run .* with run lexical-run .*other label sets"):
        fusion_candidate(smoke_config, "key", child, lexical, {}, ["negative", "positive"], force=True)
    atomic_write_json(tmp_path / "lexical" / "labels.json", {"labels": ["negative", "positive"]})
    other_rows = dataclasses.replace(lexical, val_predictions=frame.assign(source_file=["c", "d"]))
    with pytest.raises(InputError, match="different validation rows"):
        fusion_candidate(smoke_config, "key", child, other_rows, {}, ["negative", "positive"], force=True)


def test_every_kind_of_candidate_gives_the_same_row_errors_through_make_score_and_serve(comparison, tmp_path):
    from pipeline.stages import score
    from pipeline.text.conventions import text_problem

    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    rows = ["A superb, wonderful film.", "", "   ", "42", "Awful and dull from start to end."]
    pd.DataFrame({"text": rows}).to_csv(tmp_path / "in.csv", index=False)
    answers = {}
    for name in ("first_token", "nbsvm", FUSED[0]):
        uri = f"runs:/{payload['summary'][name]['run_ids'][0]}/model"
        score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri)
        answers[name] = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, dtype=str)
        assert answers[name]["score_error"].tolist() == [text_problem(text) for text in rows], name
        assert list(answers[name].columns) == ["text", "positive_probability", "predicted_label", "score_error"]
    fused_uri = f"runs:/{payload['summary'][FUSED[0]]['run_ids'][0]}/model"
    with model_server(fused_uri, config.tracking.tracking_uri) as base:
        served = invoke(base, [{"text": text} for text in rows])
    for got, want in zip(served, answers[FUSED[0]].to_dict("records")):
        assert got["score_error"] == want["score_error"] and got["predicted_label"] == want["predicted_label"]
        if want["positive_probability"]:
            assert got["positive_probability"] == pytest.approx(float(want["positive_probability"]), abs=1e-6)


def test_cross_fitting_removes_the_optimism_of_choosing_among_many_options():
    """Fifty options that are all coin flips: the best one on the rows it is chosen on looks good, its
    cross-fitted accuracy is about a half."""
    from pipeline.metrics import cross_fitted_accuracy

    rng = np.random.default_rng(1)
    options = {i: rng.random(400) < 0.5 for i in range(50)}
    chosen = max(a.mean() for a in options.values())
    assert chosen > 0.55 and abs(cross_fitted_accuracy(options) - 0.5) < 0.05
    sure = {**options, "good": rng.random(400) < 0.9}
    assert cross_fitted_accuracy(sure) > 0.85  # a real winner survives it


def test_a_fused_model_skips_a_part_whose_weight_is_zero_and_answers_the_same(comparison):
    from pipeline.model.classifiers import FusedClassifier, load_classifier

    config, _ = comparison
    mlflow.set_tracking_uri(config.tracking.tracking_uri)  # runs:/ resolves in the comparison's store
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    fused = load_classifier(f"runs:/{payload['summary'][FUSED[1]]['run_ids'][0]}/model")
    texts = ["a superb and wonderful film", "dull and awful", "the plot was a film"]
    reference = {w: fuse_probabilities_of(fused, texts, w) for w in (0.0, 1.0)}
    for weight in (0.0, 1.0):
        fused.weight = fused.short_weight = weight  # every text's weight (a length-aware fusion has two)
        prepared = fused.prepare(texts)
        assert (prepared[0] is None) == (weight == 0.0) and (prepared[1] is None) == (weight == 1.0)
        np.testing.assert_allclose(fused.score(prepared), reference[weight], atol=1e-6)
    assert isinstance(fused, FusedClassifier)


@pytest.mark.parametrize("built", ["comparison", "preset_comparison"])
def test_a_cascade_reads_with_its_transformer_only_the_texts_nbsvm_is_least_sure_of(built, request):
    """A cascaded fusion, of the pipeline's own encoder and of a real checkpoint's: the Transformer gets the texts whose
    NBSVM confidence is at most the threshold, in order; they get the fused answer and the rest NBSVM's; its
    explanations follow the same split; no threshold: the fusion of every text."""
    from pipeline.core.predictions import lexical_confidence
    from pipeline.model.classifiers import load_classifier

    config = request.getfixturevalue(built)
    config = config[0] if isinstance(config, tuple) else config
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    fused = load_classifier(f"runs:/{payload['summary'][FUSED[1]]['run_ids'][0]}/model")
    fused.weight = fused.short_weight = 0.35  # the tiny comparison's fusions chose weight 0; both parts must count
    texts = ["a superb and wonderful film", "dull and awful", "the plot was a film", "great", "bad bad bad", "a film"]
    every_text = fuse_probabilities_of(fused, texts, 0.35)
    lexical = fused.lexical.probabilities(texts)
    confidence = lexical_confidence(lexical)
    fused.cascade_threshold = float(np.sort(confidence)[2])  # the three least sure texts
    read = []
    original = fused.transformer.prepare
    fused.transformer.prepare = lambda batch: read.extend(batch) or original(batch)
    answer = fused.probabilities(texts)
    routed = confidence <= fused.cascade_threshold
    assert read == [text for text, r in zip(texts, routed) if r] and 0 < routed.sum() < len(texts)
    np.testing.assert_allclose(answer[routed], every_text[routed], atol=1e-6)
    np.testing.assert_array_equal(answer[~routed], lexical[~routed])
    if built == "comparison":  # integrated gradients through a real checkpoint cost many passes: the tiny one shows it
        explained = fused.explanations(fused.prepare(texts), top=3)
        lexical_only = fused.lexical.explanations(fused.lexical.prepare(texts), top=3)
        assert [e == x for e, x in zip(explained, lexical_only)] == (~routed).tolist()
    fused.cascade_threshold = None
    np.testing.assert_allclose(fused.probabilities(texts), every_text, atol=1e-6)


def fuse_probabilities_of(fused, texts, weight):
    from pipeline.model.classifiers import fuse_probabilities

    return fuse_probabilities(fused.transformer.probabilities(texts), fused.lexical.probabilities(texts), weight)


def test_the_tuned_config_and_the_default_are_one_comparison_that_register_chooses_from(smoke_config, capsys):
    """`make compare-tuned`: tune's best.yaml (written by its own writer) against the configured model, with NBSVM
    and the fused candidates; a tuned tokenizer setting trains on a tokenization of its own; `make register`
    takes the comparison that finished last, a rerun one included."""
    from lab.experiments import tune
    from pipeline.stages import ingest, register, tokenize

    config = smoke_config.replace(
        training={"epochs": 1}, compare={"tfidf_baseline": False, "poolings": ["first_token"], "seeds": [1]}
    )
    ingest.run(config)
    tokenize.run(config)
    main = json.loads(compare.run(config).with_suffix(".json").read_text())  # one variant, one seed
    base_tokenization = (config.data_dir / "tokenize" / "manifest.json").read_text()
    tuned_settings = {"tokenizer.max_sequence_length": 24, "model.dropout": 0.1}
    best = config.reports_dir / "tune" / "best.yaml"
    best.parent.mkdir(parents=True)
    best.write_text(tune.best_overlay(config, tuned_settings))

    capsys.readouterr()
    report = compare.run(config, design="tuned")
    assert capsys.readouterr().out.count("train: up to date") == 1  # the default level is the main comparison's run
    assert report == config.reports_dir / "comparison_tuned.md"
    payload = json.loads((config.reports_dir / "comparison_tuned.json").read_text())
    assert payload["summary"]["default"]["run_ids"] == main["summary"]["transformer"]["run_ids"]
    assert payload["variants"] == ["tuned", "default"]
    assert payload["candidates"] == ["tuned", "default", "nbsvm", "nbsvm+tuned", "nbsvm+default"]
    assert payload["levels"] == {"tuned": tuned_settings}
    effect = payload["effects"]["config"]
    assert (effect["a"], effect["b"]) == ("tuned", "default") and [s["seed"] for s in effect["mcnemar"]] == [1]
    assert set(payload["fusion_effects"]) == {"config (fused)"}
    assert "`tuned` sets `tokenizer.max_sequence_length` = 24, `model.dropout` = 0.1" in report.read_text()
    client = mlflow.tracking.MlflowClient()
    for name, (length, dropout) in {"tuned": ("24", "0.1"), "default": ("32", "0.0")}.items():
        for run_id in payload["summary"][name]["run_ids"]:
            params = client.get_run(run_id).data.params
            assert (params["tokenizer.max_sequence_length"], params["model.dropout"]) == (length, dropout)
        for run_id in payload["summary"][f"nbsvm+{name}"]["run_ids"]:  # a fused champion is tagged with its pooling
            assert client.get_run(run_id).data.params["fused.model.pooling"] == "first_token"
    # the tuned level tokenized beside the base, which it left as it was
    assert (config.data_dir / "tokenize" / "manifest.json").read_text() == base_tokenization
    assert len(list((config.data_dir / "tune").glob("tokenize-*/tokenize/manifest.json"))) == 1
    # naming another tuned file changes no other comparison's identity
    assert comparison_key(config, "main", design_for(config)) == comparison_key(
        config.replace(compare={"tuned": "elsewhere.yaml"}), "main", design_for(config)
    )

    def champion_run() -> str:
        register.run(config)
        return client.get_model_version_by_alias("smoke-sentiment", "champion").run_id

    def run_ids(report: dict) -> list[str]:
        return [run_id for name in report["candidates"] for run_id in report["summary"][name]["run_ids"]]

    assert champion_run() in run_ids(payload)  # the comparison that finished last: the tuned one
    compare.run(config, design="tuned")  # a rerun reuses every child
    assert capsys.readouterr().out.count("train: up to date") == 2
    main_again = json.loads(compare.run(config).with_suffix(".json").read_text())  # continues its first parent run
    assert main_again["parent_run_id"] == main["parent_run_id"]
    assert champion_run() in run_ids(main_again)


def test_the_tuned_level_is_the_tuned_file_and_the_default_level_keeps_the_compare_sections_settings(
    smoke_config, tmp_path
):
    from lab.experiments import tune
    from pipeline.core.errors import ConfigError, MissingInputError

    with pytest.raises(MissingInputError, match="run `make tune` first"):
        design_for(smoke_config, "tuned")

    def design(settings: dict, config=smoke_config):
        path = tmp_path / f"tuned-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(tune.best_overlay(config, settings))
        return design_for(config.replace(compare={"tuned": str(path)}), "tuned")

    for settings in ({}, {"training.seed": 99}):  # nothing but the seed, which is the comparison's
        with pytest.raises(ConfigError, match="nothing to compare"):
            design(settings)
    config = smoke_config.replace(compare={"long_reviews": ["windows"]})  # a single level: fixed for the default
    spec = design({"model.dropout": 0.1}, config)
    default, tuned = (variant_config(config, spec, {"config": level}, 1) for level in ("default", "tuned"))
    assert (default.model.long_reviews, default.model.dropout) == ("windows", 0.0)
    assert (tuned.model.long_reviews, tuned.model.dropout) == ("truncate", 0.1)  # the tuned file's own
    assert tuned.training.seed == default.training.seed == 1
    pretrained = smoke_config.replace(model={"init": "pretrained"})
    with pytest.raises(ConfigError, match="model.hidden_dim, which the masked-LM backbone is built for"):
        design({"model.hidden_dim": 32}, pretrained)
    assert design({"model.dropout": 0.1}, pretrained).overlays[0][1] == (("model.dropout", 0.1),)


def test_the_progress_line_gives_the_index_the_time_so_far_and_an_estimate_from_finished_candidates_by_kind(capsys):
    from pipeline.core.logs import duration
    from pipeline.stages.compare.runner import Progress, estimate_text, time_left

    assert time_left({}, ["transformer", "nbsvm"]) == (0.0, {"transformer": 1, "nbsvm": 1})
    assert time_left(
        {"transformer": [100.0, 120.0], "nbsvm": [10.0]}, ["transformer", "nbsvm", "fusion", "fusion"]
    ) == (
        110.0 + 10.0,
        {"fusion": 2},
    )  # a kind not timed yet is not guessed from another kind
    assert estimate_text(120.0, {}) == "about 2m00s left"
    assert estimate_text(120.0, {"nbsvm": 1, "fusion": 3, "tfidf": 1}) == (
        "about 2m00s left, then NBSVM, 3 fusions and TF-IDF (not timed yet)"
    )
    assert estimate_text(0.0, {"fusion": 1, "tfidf": 1}) == "fusion and TF-IDF left, not timed yet"
    assert (duration(59.6), duration(61), duration(3725)) == ("1m00s", "1m01s", "1h02m")
    progress = Progress(["transformer", "transformer", "nbsvm"], started=0.0)
    assert progress.run("Transformer mean seed 1", "transformer", lambda: "first") == "first"
    progress.finished["transformer"] = [600.0]  # as if that one took ten minutes
    progress.run("Transformer mean seed 2", "transformer", lambda: None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("compare: [1/3] Transformer mean seed 1: ") and lines[0].endswith(
        "elapsed, estimate after the first"
    )
    assert lines[1].startswith("compare: [2/3] Transformer mean seed 2: ") and lines[1].endswith(
        "elapsed, about 10m00s left, then NBSVM (not timed yet)"
    )  # this one at the mean of its kind


def test_a_candidates_progress_name_is_its_encoder_and_variant():
    from pipeline.stages.compare.runner import candidate_label

    assert candidate_label(None, "first_token") == "Transformer first_token"
    assert candidate_label(None, "transformer") == "Transformer"  # no factor varies
    folder = "/venv/site-packages/embeddings/sentence-transformers__all-MiniLM-L6-v2"
    assert candidate_label(folder, "mean") == "all-MiniLM-L6-v2 mean"
    assert candidate_label("bert_tiny_en_uncased", "first_token/scratch") == "bert_tiny_en_uncased first_token/scratch"


def test_the_report_says_which_encoder_a_comparison_varied():
    assert report.factors_text({"factors": {}}) == "one Transformer configuration"  # a payload from before the field
    assert report.factors_text({"factors": {}, "encoder": "all-MiniLM-L6-v2"}) == "one all-MiniLM-L6-v2 configuration"
    pooling = {"pooling": ["first_token", "mean"]}
    assert report.factors_text({"factors": pooling, "encoder": "Transformer"}) == "`pooling` (first_token vs mean)"
    assert report.factors_text({"factors": pooling, "encoder": "bert_tiny_en_uncased"}) == (
        "`pooling` (first_token vs mean) of bert_tiny_en_uncased"
    )


def test_a_length_aware_fusion_gives_short_texts_their_own_weight(own_comparison, monkeypatch, capsys):
    """compare.short_fusion_words: the Transformers are reused, every fused run logs its two weights, its model scores
    a short text with the short one and a long text with the other, and the model card says so. With
    compare.cascade_share too, each fusion is a cascade: its threshold is logged and loaded, the model answers the test
    reviews as the comparison recorded, and the card says so."""
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.compare import fusion_weights
    from pipeline.stages.register import card as register_card

    config, _ = own_comparison
    monkeypatch.setattr(fusion_weights, "MIN_ROWS", 2)  # the tiny data's few short texts still choose
    config = config.replace(compare={"short_fusion_words": 12, "cascade_share": 0.5})
    compare.run(config)
    output = capsys.readouterr().out
    assert output.count("train: up to date") == 4
    assert "up to 12 words) on the Transformer" in output, output
    assert "a cascade (share " in output and "-0.5 within 0.3% of reading every text): the Transformer reads" in output
    test_texts = pd.read_parquet(config.data_dir / "ingest" / "test.parquet")["text"].tolist()
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    client = mlflow.tracking.MlflowClient()
    for name in FUSED:
        for run_id in payload["summary"][name]["run_ids"]:
            params = client.get_run(run_id).data.params
            assert params["fusion.short_max_words"] == "12"
            classifier = load_classifier(f"runs:/{run_id}/model")
            assert classifier.short_max_words == 12
            assert classifier.short_weight == pytest.approx(float(params["fusion.short_transformer_weight"]))
            weights = classifier.row_weights(["Dull.", " ".join(["word"] * 13)])
            assert weights.tolist() == [classifier.short_weight, classifier.weight]
            tried = params["fusion.cascade_shares_tried"].split(",")
            assert tried == ["0.02", "0.05", "0.1", "0.15", "0.2", "0.3", "0.5"]
            assert params["fusion.cascade_share"] in tried
            assert classifier.cascade_threshold == float(params["fusion.cascade_threshold"])
            folder = f"fusion-{params['fusion.transformer_run']}-{params['fusion.lexical_run']}-s12-upto0.5"
            recorded = pd.read_parquet(config.reports_dir / folder / "test_predictions.parquet")
            np.testing.assert_allclose(
                classifier.probabilities(test_texts)[:, 1], recorded["positive_probability"], atol=1e-5
            )
            _, lines, _ = register_card.model_lines(client.get_run(run_id), client)
            assert "texts of at most 12 words get their own" in lines[0]
            assert "A cascade: the Transformer reads only the texts NBSVM is least sure of" in lines[0]
            assert "The share is the smallest of 0.02, 0.05" in lines[0]
