"""Pseudo-labelling: the teacher labels unlabeled reviews, the sure ones join training, refusals."""

import json
import shutil
from collections import Counter

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.__main__ import main as cli_main
from pipeline.core.catalog import PSEUDO_LABELS_FILE
from pipeline.core.errors import ConfigError, InputError
from pipeline.stages import ingest, pseudo_label, tokenize, train
from pipeline.stages.pseudo_label import teacher as pseudo_labels
from pipeline.stages.tokenize.outputs import load_split
from pipeline.stages.train import fit_and_log as training
from pipeline.text.conventions import PAD_ID
from tests.conftest import POSITIVE_WORDS, PROJECT_ROOT, make_archive, write_imdb_tree


def cue_label(text: str) -> int:
    """The label a generated review was written with: its cue words are all of one polarity."""
    return int(any(word in text.lower() for word in POSITIVE_WORDS))


def test_select_confident_keeps_rows_at_or_above_the_threshold():
    probabilities = np.array([[0.1, 0.9], [0.55, 0.45], [0.8, 0.2], [0.3, 0.7]])
    kept = pseudo_labels.select_confident(probabilities, 0.8)
    assert kept["row"].tolist() == [0, 2]
    assert kept["label"].tolist() == [1, 0]
    np.testing.assert_allclose(kept["confidence"], [0.9, 0.8])
    assert len(pseudo_labels.select_confident(probabilities, 0.0)) == 4
    assert pseudo_labels.select_confident(probabilities, 0.95).empty


def test_sample_rows_draws_a_seeded_subset_in_row_order():
    kept = pseudo_labels.select_confident(np.random.default_rng(0).dirichlet([1, 1], size=200), 0.5)
    sample = pseudo_labels.sample_rows(kept, 50, seed=7)
    assert len(sample) == 50 and sample["row"].is_monotonic_increasing
    assert set(sample["row"]) <= set(kept["row"])
    merged = sample.merge(kept, on="row", suffixes=("", "_all"))  # each row keeps its own label and confidence
    assert (merged["label"] == merged["label_all"]).all() and (merged["confidence"] == merged["confidence_all"]).all()
    assert sample.equals(pseudo_labels.sample_rows(kept, 50, seed=7))
    assert not sample.equals(pseudo_labels.sample_rows(kept, 50, seed=8))
    assert pseudo_labels.sample_rows(kept, None, seed=7) is kept and pseudo_labels.sample_rows(kept, 500, 7) is kept


def test_teacher_labels_unlabeled_reviews_and_training_uses_the_sure_ones(prepared_config, capsys):
    config = prepared_config.replace(pseudo_label={"min_confidence": 0.6})
    out_dir = pseudo_label.run(config)
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("pseudo-label: read 64 train / 16 val / 150 unlabeled reviews")
    kept = pd.read_parquet(out_dir / PSEUDO_LABELS_FILE)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["pseudo_label_rows"] == len(kept) > 0
    assert kept["confidence"].min() >= 0.6
    unlabeled = pd.read_parquet(config.data_dir / "ingest" / "unlabeled.parquet")
    texts = unlabeled["text"].to_numpy()[kept["row"].to_numpy()]
    agreement = np.mean([cue_label(t) == label for t, label in zip(texts, kept["label"])])
    assert agreement >= 0.95, agreement  # the teacher reads the cue words; labels are real, not noise
    assert (out_dir / pseudo_labels.PLOT_FILE).stat().st_size > 1000
    client = mlflow.tracking.MlflowClient()
    teacher_run = client.get_run(manifest["mlflow_run_id"])
    assert teacher_run.data.metrics["pseudo_label_rows"] == len(kept)
    assert teacher_run.data.params["pseudo_label.min_confidence"] == "0.6"

    assert pseudo_label.run(config) == out_dir
    assert "pseudo-label: up to date" in capsys.readouterr().out
    stricter = pseudo_label.run(config.replace(pseudo_label={"min_confidence": 0.9}))
    assert len(pd.read_parquet(stricter / PSEUDO_LABELS_FILE)) < len(kept)
    fewer = pd.read_parquet(
        pseudo_label.run(config.replace(pseudo_label={"min_confidence": 0.6, "max_rows": 5})) / PSEUDO_LABELS_FILE
    )
    assert len(fewer) == 5 and set(fewer["row"]) < set(kept["row"])
    assert "(a sample of at most 5)" in capsys.readouterr().out
    pseudo_label.run(config)  # back to 0.6 for training: a new teacher run with the same labels
    manifest = json.loads((out_dir / "manifest.json").read_text())
    pd.testing.assert_frame_equal(pd.read_parquet(out_dir / PSEUDO_LABELS_FILE), kept)

    run_dir = train.run(config.replace(training={"pseudo_labels": True, "epochs": 1}))
    assert "(of which" in capsys.readouterr().out
    assert run_dir.name.startswith("first_token-learned-pseudo-seed")
    run = client.get_run(json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"])
    assert run.data.tags["pseudo_labels_from"] == manifest["mlflow_run_id"]
    assert int(run.data.params["train_rows"]) == 64 + len(kept)
    assert int(run.data.params["pseudo_label_rows"]) == len(kept)
    from pipeline.stages import evaluate  # the model card counts the distilled rows apart
    from pipeline.stages.register import card as register_card

    evaluate.run(config, run=run.info.run_id)
    card = register_card.model_card("m", "1", run, register_card.run_evaluation(run.info.run_id)[0], {}, 1, "parent")
    assert f"64 labelled training reviews plus {len(kept):,} unlabeled ones with the nbsvm teacher's" in card

    # a rerun that writes the same labels leaves the run up to date; other labels get their own folder
    pseudo_label.run(config, force=True)
    assert train.run(config.replace(training={"pseudo_labels": True, "epochs": 1})) == run_dir
    assert "train: up to date" in capsys.readouterr().out
    pseudo_label.run(config.replace(pseudo_label={"min_confidence": 0.9}))
    other_dir, _, _ = training.run_directory(
        config.replace(training={"pseudo_labels": True, "epochs": 1}), config.data_dir / "tokenize"
    )
    assert other_dir != run_dir
    pseudo_label.run(config)

    # one epoch holds every gold and every pseudo-labelled review exactly once, each with its label
    hard = config.replace(training={"pseudo_labels": True}, pseudo_label={"soft": False})  # class indices
    data = training.load_training_data(hard, config.data_dir / "tokenize", 1)
    seen = Counter(
        (tuple(row[row != PAD_ID]), int(label)) for x, y in data.train for row, label in zip(x.numpy(), y.numpy())
    )
    gold_ids, gold_labels = load_split(config.data_dir / "tokenize", "train")
    unlabeled_ids = np.load(config.data_dir / "tokenize" / "unlabeled_ids.npy")
    expected = Counter((tuple(row[row != PAD_ID]), int(label)) for row, label in zip(gold_ids, gold_labels))
    expected.update(
        (tuple(unlabeled_ids[r][unlabeled_ids[r] != PAD_ID]), int(label))
        for r, label in zip(kept["row"], kept["label"])
    )
    assert seen == expected


def test_training_makes_its_pseudo_labels_or_goes_without_when_nothing_is_unlabeled(prepared_config, tmp_path, capsys):
    """``training.pseudo_labels`` on: the labels are made before training (then found up to date); an ingest
    without unlabeled reviews trains without distillation, says so, and the run's config says it too."""
    config = prepared_config.replace(training={"pseudo_labels": True})
    out_dir = config.data_dir / "pseudo_label"
    assert not out_dir.exists()
    assert pseudo_labels.with_pseudo_labels(config, make=False) is config  # a cluster's worker: made before
    assert not out_dir.exists() and "pseudo-label stage" not in capsys.readouterr().out
    assert pseudo_labels.with_pseudo_labels(config) is config
    output = capsys.readouterr().out  # the stage that runs another's work says so, first
    assert output.startswith("train: running the pseudo-label stage first (training.pseudo_labels)\n")
    assert (out_dir / PSEUDO_LABELS_FILE).is_file() and "pseudo-label: read" in output
    assert pseudo_labels.with_pseudo_labels(config, stage="compare") is config
    output = capsys.readouterr().out
    assert output.startswith("compare: running the pseudo-label stage first") and "pseudo-label: up to date" in output

    bare_dir = tmp_path / "bare"
    shutil.copytree(config.data_dir / "ingest", bare_dir / "ingest")
    (bare_dir / "ingest" / "unlabeled.parquet").unlink()
    bare = config.replace(paths={"data_dir": str(bare_dir)})
    plain = pseudo_labels.with_pseudo_labels(bare)
    assert plain == bare.replace(training={"pseudo_labels": False})
    assert capsys.readouterr().out.startswith("train: no unlabeled reviews")
    assert not (bare_dir / "pseudo_label").exists()
    off = config.replace(training={"pseudo_labels": False})
    assert pseudo_labels.with_pseudo_labels(off) is off


def test_refusals_name_what_is_missing(prepared_config, tmp_path, capsys):
    with pytest.raises(ConfigError, match="pseudo_label.teacher"):
        prepared_config.replace(pseudo_label={"teacher": "bert"})
    with pytest.raises(ConfigError, match="pseudo_label.max_rows"):
        prepared_config.replace(pseudo_label={"max_rows": 0})
    with pytest.raises(ConfigError, match="training.pseudo_labels and training.max_train_samples"):
        prepared_config.replace(training={"pseudo_labels": True, "max_train_samples": 20})

    pseudo_label.run(prepared_config.replace(pseudo_label={"min_confidence": 1.0}))
    assert "warning: no unlabeled review reached" in capsys.readouterr().out
    with pytest.raises(InputError, match="no pseudo labels .*min_confidence 1.0"):
        training.load_training_data(
            prepared_config.replace(training={"pseudo_labels": True}), prepared_config.data_dir / "tokenize", 1
        )

    pseudo_label.run(prepared_config)
    # tokenized from another ingestion than the one the pseudo labels were made from
    write_imdb_tree(tmp_path / "other", per_class={"train": 30, "test": 10}, seed=9, unlabeled=20)
    other = prepared_config.replace(data={"archive": str(make_archive(tmp_path / "other", tmp_path / "other.tar.gz"))})
    ingest.run(other)
    tokenize.run(other)
    with pytest.raises(InputError, match="another ingestion"):
        training.load_training_data(other.replace(training={"pseudo_labels": True}), other.data_dir / "tokenize", 1)


def test_without_unlabeled_reviews_the_stage_says_how_to_get_them(smoke_config, capsys):
    ingest.run(smoke_config)
    assert (
        cli_main(
            [
                "pseudo-label",
                "--config",
                str(PROJECT_ROOT / "configs" / "smoke.yaml"),
                "--set",
                f"data.archive={smoke_config.data.archive}",
                "--set",
                f"paths.data_dir={smoke_config.data_dir}",
            ]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert "IMDB_UNSUP_ARCHIVE" in error and "unlabeled" in error
    assert not (smoke_config.data_dir / "pseudo_label").exists()


def test_the_comparison_key_follows_the_teacher_settings_only_when_training_uses_them(prepared_config):
    from pipeline.stages.compare.runner import comparison_key

    off, stricter_off = prepared_config, prepared_config.replace(pseudo_label={"min_confidence": 0.9})
    assert comparison_key(off, "pooling") == comparison_key(stricter_off, "pooling")
    on = prepared_config.replace(training={"pseudo_labels": True})
    assert comparison_key(on, "pooling") != comparison_key(off, "pooling")
    assert comparison_key(on, "pooling") != comparison_key(on.replace(pseudo_label={"min_confidence": 0.9}), "pooling")


def test_soft_targets_carry_the_nbsvm_teacher_probabilities_into_training(prepared_config):
    """Distillation: pseudo_label.soft trains on the teacher's probabilities (gold rows one-hot), and the
    default teacher is NBSVM."""
    from pipeline.core.catalog import teacher_probability_column

    assert prepared_config.pseudo_label.teacher == "nbsvm" and prepared_config.pseudo_label.soft
    out_dir = pseudo_label.run(prepared_config)
    kept = pd.read_parquet(out_dir / PSEUDO_LABELS_FILE)
    columns = [teacher_probability_column(i) for i in range(2)]
    np.testing.assert_allclose(kept[columns].sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(kept[columns].max(axis=1), kept["confidence"], rtol=1e-6)
    config = prepared_config.replace(training={"pseudo_labels": True, "epochs": 1})
    data = training.load_training_data(config, config.data_dir / "tokenize", 1)
    assert data.soft_targets and data.pseudo_label_rows == len(kept)
    targets = np.concatenate([labels.numpy() for _, labels in data.train])
    assert targets.shape[1] == 2 and np.allclose(targets.sum(axis=1), 1.0, atol=1e-5)
    soft_rows = ~np.isclose(targets.max(axis=1), 1.0)
    assert soft_rows.sum() > 0  # the teacher's probabilities, not hard labels
    run_dir = train.run(config)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["inputs"]["pseudo_label_targets"] == "soft"
    hard = prepared_config.replace(pseudo_label={"soft": False}, training={"pseudo_labels": True})
    pseudo_label.run(hard)
    assert not training.load_training_data(hard, hard.data_dir / "tokenize", 1).soft_targets
    hard_dir, _, inputs = training.run_directory(hard.replace(training={"epochs": 1}), hard.data_dir / "tokenize")
    assert hard_dir != run_dir and inputs["pseudo_label_targets"] == "hard"  # the same file, another run


def test_a_logged_model_teaches_with_the_probabilities_it_would_score(prepared_config, trained_run, tmp_path, capsys):
    """``pseudo_label.teacher`` a model URI (the champion, a fused run, a folder): the soft targets are that
    model's own probabilities, its model UUID is an input (a re-logged model makes new labels), a row it cannot
    score is never kept, and a model of other classes or no model at all is one error naming the key."""
    from pipeline.core.catalog import LABELS_FILE, teacher_probability_column
    from pipeline.model.classifiers import load_classifier

    trained_config, run_dir = trained_run
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    mlflow.set_tracking_uri(trained_config.tracking.tracking_uri)  # runs:/ finds its logged model in this store
    folder = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model", dst_path=str(tmp_path / "logged"))
    teacher = shutil.copytree(folder, tmp_path / "teacher")
    config = prepared_config.replace(pseudo_label={"teacher": str(teacher), "max_rows": 40})
    out_dir = pseudo_label.run(config)
    output = capsys.readouterr().out
    assert f"pseudo-label: loading the teacher {teacher}" in output and "wrote 40 pseudo labels" in output
    kept = pd.read_parquet(out_dir / PSEUDO_LABELS_FILE)
    unlabeled = pd.read_parquet(config.data_dir / "ingest" / "unlabeled.parquet")["text"].tolist()
    classifier = load_classifier(str(teacher))
    expected = classifier.probabilities([unlabeled[row] for row in kept["row"]])
    np.testing.assert_allclose(kept[[teacher_probability_column(i) for i in range(2)]], expected, atol=1e-5)
    assert (kept["label"].to_numpy() == expected.argmax(axis=1)).all()
    manifest = json.loads((out_dir / "manifest.json").read_text())
    uuid = mlflow.models.Model.load(str(teacher)).model_uuid
    assert manifest["inputs"]["teacher_model_uuid"] == uuid
    run = mlflow.tracking.MlflowClient().get_run(manifest["mlflow_run_id"])
    assert run.info.run_name == "pseudo-label-model" and run.data.tags["teacher"] == str(teacher)
    val = pd.read_parquet(config.data_dir / "ingest" / "val.parquet")
    val_accuracy = (classifier.probabilities(val["text"].tolist()).argmax(axis=1) == val["label"]).mean()
    assert manifest["teacher_val_accuracy"] == pytest.approx(val_accuracy, abs=1e-6)

    assert pseudo_label.run(config) == out_dir and "pseudo-label: up to date" in capsys.readouterr().out
    mlmodel = teacher / "MLmodel"  # the same place, another model (as a moved models:/...@champion alias is)
    other = uuid[:-6] + ("abcdef" if uuid[-6:] != "abcdef" else "fedcba")
    mlmodel.write_text(mlmodel.read_text().replace(uuid, other))
    pseudo_label.run(config)
    assert "pseudo-label: read" in capsys.readouterr().out
    assert json.loads((out_dir / "manifest.json").read_text())["inputs"]["teacher_model_uuid"] == other

    probabilities = pseudo_labels.model_probabilities(classifier, ["A superb film.", "", "42", "Dull and awful."])
    assert np.isnan(probabilities[[1, 2]]).all() and not np.isnan(probabilities[[0, 3]]).any()
    assert pseudo_labels.select_confident(probabilities, 0.0)["row"].tolist() == [0, 3]

    renamed = shutil.copytree(teacher, tmp_path / "renamed")
    (labels_file,) = renamed.rglob(LABELS_FILE)
    labels_file.write_text(json.dumps({"labels": ["bad", "good"]}))
    before = (out_dir / PSEUDO_LABELS_FILE).read_bytes()
    with pytest.raises(InputError, match=r"pseudo_label.teacher .* classes \['bad', 'good'\]; the ingested reviews"):
        pseudo_label.run(config.replace(pseudo_label={"teacher": str(renamed)}))
    with pytest.raises(InputError, match="pseudo_label.teacher: cannot read model"):
        pseudo_label.run(config.replace(pseudo_label={"teacher": str(tmp_path / "no_such_model")}))
    assert (out_dir / PSEUDO_LABELS_FILE).read_bytes() == before  # refusals leave the labels as they were


def test_sentence_crops_of_train_reviews_join_the_distilled_rows_with_soft_targets(prepared_config):
    """pseudo_label.crops_per_review: crops of every train review, each target mixing its review's label with a
    cross-fitted NBSVM; training reads them as extra soft rows, in a run folder of its own."""
    from pipeline.core.catalog import PSEUDO_CROPS_FILE, teacher_probability_column
    from pipeline.stages.ingest.outputs import read_split

    config = prepared_config.replace(
        pseudo_label={"crops_per_review": 2, "crop_label_weight": 0.6}, training={"pseudo_labels": True, "epochs": 1}
    )
    out_dir = pseudo_label.run(config)
    crops = pd.read_parquet(out_dir / PSEUDO_CROPS_FILE)
    train_split = read_split(config.data_dir / "ingest", "train", columns=["text", "label"])
    assert (
        len(crops) == 2 * len(train_split)
        and crops["review"].tolist() == np.repeat(range(len(train_split)), 2).tolist()
    )
    columns = [teacher_probability_column(i) for i in range(2)]
    targets = crops[columns].to_numpy()
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=1e-5)
    own = targets[np.arange(len(crops)), train_split["label"].to_numpy()[crops["review"]]]
    assert (own >= 0.6 - 1e-6).all() and (own < 1.0).any()  # the review's label weighs 0.6, the teacher the rest
    from pipeline.text.crops import sentences

    for text, review in zip(crops["text"], crops["review"]):  # one or two consecutive sentences of its review
        pieces = sentences(train_split["text"].iloc[review])
        assert text in {" ".join(pieces[i : i + n]) for n in (1, 2) for i in range(len(pieces))}
    kept = pd.read_parquet(out_dir / PSEUDO_LABELS_FILE)
    data = training.load_training_data(config, config.data_dir / "tokenize", 1)
    assert data.pseudo_label_rows == len(kept) + len(crops)
    assert data.train_rows == len(train_split) + len(kept) + len(crops)
    plain_dir, _, _ = training.run_directory(
        config.replace(pseudo_label={"crops_per_review": 0}), config.data_dir / "tokenize"
    )
    crops_dir, _, inputs = training.run_directory(config, config.data_dir / "tokenize")
    assert crops_dir != plain_dir and "training_crops_sha256" in inputs
    (out_dir / PSEUDO_CROPS_FILE).unlink()  # labels made before the setting: one error that says what to run
    with pytest.raises(FileNotFoundError, match="pseudo_label.crops_per_review.*make pseudo-label"):
        training.run_directory(config, config.data_dir / "tokenize")
