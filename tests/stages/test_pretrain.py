"""Pretraining: unlabeled reviews in, a masked-LM loss that falls, weights that transfer, resume, refusals."""

import json

import keras
import mlflow
import numpy as np
import pytest

from pipeline.core.catalog import BACKBONE_SPEC_FILE
from pipeline.core.errors import InputError, MissingInputError
from pipeline.stages import ingest, pretrain, tokenize, train
from pipeline.stages.pretrain import masked_lm as pretraining
from pipeline.stages.pretrain import masking as backbone
from pipeline.text.conventions import MASK_ID
from pipeline.text.wordpiece import WordPieceTextTokenizer
from tests.conftest import PREPARED_UNLABELED, make_archive, write_imdb_tree


@pytest.fixture
def unsup_config(prepared_data, tmp_path):
    """The prepared data set's config (a tiny archive that also holds train/unsup, as the canonical one does),
    writing under this test's folder, nothing ingested yet."""
    return prepared_data.replace(paths={"data_dir": str(tmp_path / "data"), "reports_dir": str(tmp_path / "reports")})


def test_unlabeled_reviews_are_ingested_and_tokenized_for_pretraining_only(prepared_config, capsys):
    config = prepared_config
    manifest = json.loads((config.data_dir / "ingest" / "manifest.json").read_text())
    assert manifest["unlabeled_rows"] == PREPARED_UNLABELED
    assert (config.data_dir / "tokenize" / "unlabeled_ids.npy").is_file()
    assert not (config.data_dir / "tokenize" / "unlabeled_labels.npy").exists()
    encoder = WordPieceTextTokenizer.load(config.data_dir / "tokenize")
    assert encoder.can_mask and encoder.vocabulary[MASK_ID] == "[MASK]"
    # the copy in this test's folder is a prepared data folder of its own: neither stage runs again there
    ingest.run(config)
    tokenize.run(config)
    out = capsys.readouterr().out
    assert f"ingest: up to date, nothing to do ({config.data_dir / 'ingest'}/" in out
    assert f"tokenize: up to date, nothing to do ({config.data_dir / 'tokenize'}/" in out


def test_masking_follows_bert_and_never_touches_padding_or_cls():
    keras.utils.set_random_seed(0)
    ids = np.zeros((64, 32), dtype=np.int32)
    ids[:, 0] = 2
    ids[:, 1:25] = np.random.default_rng(0).integers(10, 90, (64, 24))
    masked = {k: np.asarray(v) for k, v in backbone.mask_generator(100, 32, 0.15)(ids).items()}
    positions, weights = masked["mask_positions"], masked["mask_weights"] > 0
    assert positions.shape[1] == backbone.mask_selection_length(32, 0.15)
    chosen = positions[weights]
    assert chosen.min() >= 1 and chosen.max() <= 24  # real tokens only: not [CLS], not padding
    rows = np.repeat(np.arange(64)[:, None], positions.shape[1], axis=1)[weights]
    replaced = masked["token_ids"][rows, chosen]
    assert 0.7 < (replaced == MASK_ID).mean() < 0.9  # about 80 % become [MASK]
    np.testing.assert_array_equal(masked["mask_ids"][weights], ids[rows, chosen])


def test_loss_falls_weights_transfer_and_the_run_records_its_pretraining(prepared_config, capsys):
    config = prepared_config.replace(pretrain={"max_steps": 60})
    out_dir = pretrain.run(config)
    history = json.loads((out_dir / "history.json").read_text())
    assert history["step"] == [10, 20, 30, 40, 50, 60]
    assert history["loss"][-1] < history["loss"][0]
    assert (out_dir / "loss_curve.png").stat().st_size > 1000
    spec = json.loads((out_dir / BACKBONE_SPEC_FILE).read_text())
    client = mlflow.tracking.MlflowClient()
    artifacts = {a.path for a in client.list_artifacts(spec["mlflow_run_id"], "backbone")}
    assert "backbone/backbone.weights.npz" in artifacts
    assert [m.step for m in client.get_metric_history(spec["mlflow_run_id"], "mlm_loss")] == history["step"]

    assert pretrain.run(config) == out_dir
    assert "pretrain: up to date" in capsys.readouterr().out

    fine_tune = config.replace(model={"init": "pretrained"}, training={"epochs": 1})
    run_dir = train.run(fine_tune)
    assert "started from the pretrained backbone" in capsys.readouterr().out
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    assert client.get_run(run_id).data.tags["pretrained_from"] == spec["mlflow_run_id"]
    assert client.get_run(run_id).data.params["model.init"] == "pretrained"
    # the same backbone is also reachable through its MLflow run
    from_run = config.replace(
        model={"init": "pretrained", "pretrained": f"runs:/{spec['mlflow_run_id']}/backbone"},
        training={"epochs": 1, "seed": 5},
    )
    assert train.run(from_run).is_dir()


class StopAfterPeriod(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt("simulated kill")


def test_a_killed_pretraining_resumes_from_its_checkpoint(prepared_config, capsys):
    config = prepared_config
    with pytest.raises(KeyboardInterrupt):
        pretraining.pretrain(config, extra_callbacks=[StopAfterPeriod()])
    assert (config.data_dir / "pretrain" / pretraining.CHECKPOINT_DIR).is_dir()
    out_dir = pretrain.run(config)
    assert "resuming MLflow run" in capsys.readouterr().out
    history = json.loads((out_dir / "history.json").read_text())
    assert history["step"] == [10, 20, 30, 40]  # continued after step 20, not restarted
    spec = json.loads((out_dir / BACKBONE_SPEC_FILE).read_text())
    steps = [m.step for m in mlflow.tracking.MlflowClient().get_metric_history(spec["mlflow_run_id"], "mlm_loss")]
    assert steps == [10, 20, 30, 40]
    assert not (out_dir / pretraining.CHECKPOINT_DIR).exists()


def test_fine_tuning_refuses_another_vocabulary_or_width(prepared_config):
    config = prepared_config
    pretrain.run(config)
    wider = config.replace(model={"init": "pretrained", "hidden_dim": 32}, training={"epochs": 1})
    with pytest.raises(InputError, match="width"):
        train.run(wider)
    other_vocabulary = config.replace(
        tokenizer={"vocabulary_size": 60}, model={"init": "pretrained"}, training={"epochs": 1}
    )
    tokenize.run(other_vocabulary)
    with pytest.raises(InputError, match="different vocabulary"):
        train.run(other_vocabulary)


def test_unlabeled_archive_missing_corrupt_or_empty_is_named(unsup_config, tmp_path, monkeypatch):
    monkeypatch.setenv("IMDB_UNSUP_ARCHIVE", str(tmp_path / "nope.tar.gz"))
    with pytest.raises(MissingInputError, match=r"nope\.tar\.gz.*IMDB_UNSUP_ARCHIVE"):
        ingest.run(unsup_config)
    corrupt = tmp_path / "corrupt.tar.gz"
    corrupt.write_bytes(b"not a tar file")
    monkeypatch.setenv("IMDB_UNSUP_ARCHIVE", str(corrupt))
    with pytest.raises(InputError, match="corrupt.tar.gz"):
        ingest.run(unsup_config)
    write_imdb_tree(tmp_path / "labeled_only", per_class={"train": 2, "test": 2})
    empty = make_archive(tmp_path / "labeled_only", tmp_path / "empty_unsup.tar.gz")
    monkeypatch.setenv("IMDB_UNSUP_ARCHIVE", str(empty))
    with pytest.raises(InputError, match=r"empty_unsup\.tar\.gz: holds no train/unsup"):
        ingest.run(unsup_config)
    assert not (unsup_config.data_dir / "ingest").exists()


def test_pretraining_needs_the_mask_token(prepared_config):
    config = prepared_config
    settings = json.loads((config.data_dir / "tokenize" / "tokenizer.json").read_text())
    vocabulary = (config.data_dir / "tokenize" / "vocabulary.txt").read_text().split("\n")[:-1]
    vocabulary[MASK_ID] = "[OLD]"
    text = "".join(token + "\n" for token in vocabulary)
    (config.data_dir / "tokenize" / "vocabulary.txt").write_text(text)
    from pipeline.core.files import sha256_text

    (config.data_dir / "tokenize" / "tokenizer.json").write_text(
        json.dumps({**settings, "vocabulary_sha256": sha256_text(text)})
    )
    with pytest.raises(InputError, match=r"no \[MASK\] token"):
        pretrain.run(config)


def test_budget_curve_fine_tunes_from_scratch_and_from_the_pretrained_backbone(prepared_config):
    """One encoder size's curve, added to a report that already holds another size's over the same data."""
    from lab.experiments import pretrain_budget
    from pipeline.core.catalog import stage_dir
    from pipeline.core.files import manifest_hash

    config = prepared_config.replace(
        training={"epochs": 1}, pretrain={"max_steps": 20}
    )  # any budget > 0 makes the curve
    other = {
        "encoder": "width 8, 1 block, 1 heads, ff 8",
        "pretrain_minutes": 0.0,
        "seed": 1,
        "run_id": "r0",
        "best_val_accuracy": 0.5,
        "test_accuracy": 0.5,
    }
    earlier = {
        "tokenize_manifest_sha256": manifest_hash(stage_dir(config, "tokenize")),
        "rows": [other],
        "pretrain_runs": {other["encoder"]: "p0"},
        "baseline_test_accuracy": 0.9,
    }
    config.reports_dir.mkdir(parents=True)
    (config.reports_dir / "pretraining_budget.json").write_text(json.dumps(earlier))
    report = pretrain_budget.run(config, seeds=(1,))  # the baseline: the earlier report's
    payload = json.loads((config.reports_dir / "pretraining_budget.json").read_text())
    small = pretrain_budget.encoder_label(config.model.backbone())
    assert payload["rows"][0] == other and [row["encoder"] for row in payload["rows"]] == [
        other["encoder"],
        small,
        small,
    ]
    minutes = [row["pretrain_minutes"] for row in payload["rows"][1:]]
    assert minutes[0] == 0 and minutes[-1] > 0
    assert set(payload["pretrain_runs"]) == {other["encoder"], small} and payload["baseline_test_accuracy"] == 0.9
    client = mlflow.tracking.MlflowClient()
    assert "pretrained_from" not in client.get_run(payload["rows"][1]["run_id"]).data.tags
    assert client.get_run(payload["rows"][2]["run_id"]).data.tags["pretrained_from"] == payload["pretrain_runs"][small]
    assert report.read_text().count(f"| {small} | ") == 4  # two summary lines, two run lines
    assert (config.reports_dir / "pretraining_budget.png").stat().st_size > 1000


def test_rerunning_an_encoder_size_replaces_its_rows_and_other_data_starts_a_new_report():
    from lab.experiments.pretrain_budget import merge_rows

    def row(encoder, minutes):
        return {"encoder": encoder, "pretrain_minutes": minutes, "seed": 1}

    previous = {
        "tokenize_manifest_sha256": "abc",
        "rows": [row("a", 0), row("a", 5), row("b", 0), row("b", 5)],
        "pretrain_runs": {"a": "run-a", "b": "run-b"},
    }
    rows, runs = merge_rows(previous, "abc", "b", [row("b", 0), row("b", 10)])
    assert rows == [row("a", 0), row("a", 5), row("b", 0), row("b", 10)] and runs == {"a": "run-a"}
    assert merge_rows(previous, "abc", "c", [row("c", 0)]) == (
        previous["rows"] + [row("c", 0)],
        previous["pretrain_runs"],
    )
    assert merge_rows(previous, "other data", "b", [row("b", 0)]) == ([row("b", 0)], {})
    assert merge_rows(None, "abc", "b", [row("b", 0)]) == ([row("b", 0)], {})


def test_budget_summary_matches_seeds_and_picks_the_budget_on_validation():
    from lab.experiments.pretrain_budget import chosen_budgets, summarize

    def row(encoder, minutes, seed, val, test):
        return {
            "encoder": encoder,
            "pretrain_minutes": minutes,
            "seed": seed,
            "best_val_accuracy": val,
            "test_accuracy": test,
        }

    rows = [
        row("a", 0, 1, 0.80, 0.70),
        row("a", 0, 2, 0.82, 0.74),
        row("a", 10, 1, 0.85, 0.71),
        row("a", 10, 3, 0.85, 0.99),
        row("a", 20, 1, 0.84, 0.90),
        row("b", 0, 1, 0.9, 0.8),
        row("b", 5, 1, 0.9, 0.6),
    ]
    summary = {(p["encoder"], p["pretrain_minutes"]): p for p in summarize(rows)}
    assert summary[("a", 0)]["mean_test_accuracy"] == pytest.approx(0.72)
    assert summary[("a", 0)]["test_std"] == pytest.approx(np.std([0.70, 0.74], ddof=1))
    assert summary[("a", 0)]["test_minus_scratch"] is None
    assert summary[("a", 10)]["test_minus_scratch"] == pytest.approx(0.01)  # seed 3 has no scratch run to pair with
    assert summary[("a", 20)]["test_std"] is None
    # chosen on validation, not on the better test accuracy at 20; a tie goes to the smaller budget
    assert chosen_budgets(list(summary.values())) == {"a": 10, "b": 0}


def test_budget_baseline_defaults_to_the_comparison_report(tmp_path):
    from lab.experiments.pretrain_budget import comparison_baseline

    assert comparison_baseline(tmp_path) is None
    (tmp_path / "comparison.json").write_text(json.dumps({"summary": {"first_token": {}}}))
    assert comparison_baseline(tmp_path) is None
    (tmp_path / "comparison.json").write_text(
        json.dumps({"summary": {"baseline": {"test_accuracy": {"mean": 0.9033}}}})
    )
    assert comparison_baseline(tmp_path) == 0.9033  # a report written when TF-IDF was the baseline
    (tmp_path / "comparison.json").write_text(
        json.dumps(
            {"summary": {"nbsvm": {"test_accuracy": {"mean": 0.9158}}, "tfidf": {"test_accuracy": {"mean": 0.9033}}}}
        )
    )
    assert comparison_baseline(tmp_path) == 0.9158


def test_an_unreadable_budget_report_is_refused_by_name_not_overwritten(tmp_path):
    from lab.experiments.pretrain_budget import read_previous_report
    from pipeline.core.errors import InputError

    assert read_previous_report(tmp_path / "pretraining_budget.json") is None
    broken = tmp_path / "pretraining_budget.json"
    broken.write_text('{"rows": [')
    with pytest.raises(InputError, match="pretraining_budget.json: not a readable budget report"):
        read_previous_report(broken)
    broken.write_text("[1, 2]")
    with pytest.raises(InputError, match="expected a JSON object"):
        read_previous_report(broken)
    assert broken.read_text() == "[1, 2]"
