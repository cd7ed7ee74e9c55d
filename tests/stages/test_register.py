"""``make register``: the best-validation candidate of any kind of the latest comparison as ``@champion``, and its
model card (on the suite's shared comparison: ``comparison`` and ``own_comparison`` in ``tests/conftest.py``)."""

import json

import mlflow
import pandas as pd

from pipeline.tracking import selection_accuracy

FUSED = ["nbsvm+first_token", "nbsvm+mean"]  # the shared comparison's fused candidates


def test_register_picks_the_best_validation_candidate_of_any_kind_and_score_uses_it(own_comparison, tmp_path, capsys):
    from pipeline.stages import register, score
    from pipeline.stages.register import card as register_card

    config, _ = own_comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    uri = register.run(config)
    assert uri == "models:/smoke-sentiment@champion"
    printed = "".join(capsys.readouterr())  # quiet: the stage's line, not MLflow's registry notices
    assert "register: read " in printed
    assert "Successfully registered" not in printed and "Created version" not in printed
    client = mlflow.tracking.MlflowClient()
    champion = client.get_model_version_by_alias("smoke-sentiment", "champion")
    group = payload["recommendation"]["variant"]  # the candidate with the best mean validation accuracy
    members = payload["summary"][group]["run_ids"]
    val_accuracy = {run_id: selection_accuracy(client.get_run(run_id).data.metrics) for run_id in members}
    assert champion.run_id in members
    assert val_accuracy[champion.run_id] == max(val_accuracy.values())
    # the rule: of the candidates within the tolerance of the best validation accuracy, the best on the crops
    summary = {name: entry for name, entry in payload["summary"].items() if entry["kind"] != "reference"}
    best_val = max(entry["selection_val_accuracy"]["mean"] for entry in summary.values())
    close = [
        name
        for name, entry in summary.items()
        if entry["selection_val_accuracy"]["mean"] >= best_val - config.compare.champion_tolerance - 1e-12
    ]
    assert group in close
    assert summary[group]["val_crop_accuracy"]["mean"] == max(summary[n]["val_crop_accuracy"]["mean"] for n in close)
    capsys.readouterr()
    register.run(config)
    assert "up to date" in capsys.readouterr().out

    # the model card: the version's description and reports/<run_id>/model_card.md, from the run's own numbers
    card = (config.reports_dir / champion.run_id / "model_card.md").read_text()
    assert client.get_model_version("smoke-sentiment", champion.version).description == card
    run = client.get_run(champion.run_id)
    evaluation, _ = register_card.run_evaluation(champion.run_id)
    accuracy = run.data.metrics["test_accuracy"]
    line = next(li for li in card.splitlines() if li.startswith("- accuracy "))
    low, high = (float(x) for x in line.split("95% CI ")[1].rstrip(")").split(" to "))
    assert line.startswith(f"- accuracy {accuracy:.4f}") and low <= accuracy <= high
    assert f"{evaluation['test_rows']:,} test reviews" in card
    kind = run.data.tags["model_kind"]
    if kind == "nbsvm":
        assert "NBSVM" in card and "cut to" not in card
    else:
        params = (
            run.data.params
            if kind == "transformer"
            else client.get_run(run.data.params["fusion.transformer_run"]).data.params
        )
        assert f"cut to **{params['tokenizer.max_sequence_length']} tokens**" in card
        assert f"**{params['model.pooling']} pooling**" in card
    assert f"expected calibration error {run.data.metrics['test_ece']:.4f}" in card
    for capability, rate in evaluation["behaviour"].items():
        assert f"| {capability} | {rate:.0%} |" in card
    assert "English only" in card and "Intended use" in card
    # accuracy by length and on the crops, and the shortest text it was validated on
    validated = int(run.data.metrics["validated_min_words"])
    assert "## Accuracy by length" in card and f"**{validated} words**" in card
    crops = evaluation["sentence_crops"]["test"]
    assert f"| sentence crops of the test reviews | {crops['rows']:,} | {crops['accuracy']:.4f} (" in card

    texts = ["superb and wonderful", "awful and dull", "a long review " * 20]
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "in.csv", index=False)
    capsys.readouterr()
    summary = score.run(config, tmp_path / "in.csv", tmp_path / "out.csv")  # default: the champion
    assert summary["scored"] == 3
    short = sum(len(text.split()) < validated for text in texts)
    assert summary["short"] == short
    assert f"scored 3, {short} shorter than the {validated} words the model was validated on" in capsys.readouterr().out


def test_model_cards_describe_each_kind_of_candidate(comparison):
    from pipeline.stages.register import card as register_card

    config, _ = comparison
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    client = mlflow.tracking.MlflowClient()
    expected = {
        "first_token": "**first_token pooling**",
        "nbsvm": "naive-Bayes log-count ratio",
        FUSED[0]: "on the Transformer**",
    }
    for name, phrase in expected.items():
        run = client.get_run(payload["summary"][name]["run_ids"][0])
        evaluation, _ = register_card.run_evaluation(run.info.run_id)
        card = register_card.model_card("m", "1", run, evaluation, {}, 17, payload["parent_run_id"])
        assert phrase in card and f"{evaluation['test_rows']:,} test reviews" in card
        assert ("cut to" in card) == (name != "nbsvm")
        train_rows = int(
            client.get_run(run.data.params.get("fusion.transformer_run", run.info.run_id)).data.params["train_rows"]
        )
        assert f"- Splits: {train_rows:,} " in card and "?" not in card.split("- Splits: ")[1].split(" test")[0]


def test_the_model_card_says_how_the_transformer_reads_a_long_review():
    from pipeline.model.kinds.transformer_classifier import transformer_lines

    params = {"tokenizer.max_sequence_length": "256", "tokenizer.truncation": "head_tail", "model.pooling": "mean"}
    cut = "\n".join(transformer_lines(params, {}))
    assert "cut to **256 tokens** (head_tail truncation)." in cut and "windows" not in cut
    read = "\n".join(transformer_lines({**params, "model.long_reviews": "windows"}, {}))
    assert "cut to **256 tokens** (head_tail truncation) for training" in read and "windows covering all of it" in read


def test_the_model_card_says_what_nbsvm_read_besides_the_reviews():
    from pipeline.model.kinds.nbsvm_classifier import lexical_lines

    params = {
        "nbsvm.vocabulary": "800000",
        "nbsvm.C": "0.1",
        "nbsvm.C_grid": "0.03,0.1",
        "nbsvm.crops_per_review": "4",
        "nbsvm.crop_label_weight": "0.5",
        "nbsvm.unlabeled_crops_per_review": "2",
        "nbsvm.unlabeled_reviews": "50000",
    }
    both = "\n".join(lexical_lines(params))
    assert "4 random 1-2-sentence crops of each" in both and "2 crops of each of 50,000 unlabeled reviews" in both
    alone = "\n".join(lexical_lines({**params, "nbsvm.unlabeled_reviews": "0"}))
    assert "4 random 1-2-sentence crops" in alone and "unlabeled" not in alone
    older = "\n".join(lexical_lines({key: value for key, value in params.items() if "unlabeled" not in key}))
    assert "unlabeled" not in older  # a run logged before the setting existed
