"""Bring-your-own data: CSV/TSV/Parquet tables, string or integer labels, more than two classes."""

import json
import random
import shutil
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from pipeline.config import load_config
from pipeline.stages import evaluate, ingest, score, tokenize, train
from pipeline.stages.ingest.tables import sort_labels
from tests.conftest import NEGATIVE_WORDS, NEUTRAL_WORDS, POSITIVE_WORDS, PROJECT_ROOT

MIXED_WORDS = ["okay", "average", "fine", "ordinary", "acceptable", "middling"]
CUES = {"bad": NEGATIVE_WORDS, "meh": MIXED_WORDS, "good": POSITIVE_WORDS}


def make_rows(count: int, seed: int = 0) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        label = list(CUES)[index % 3]
        words = [rng.choice(NEUTRAL_WORDS) for _ in range(rng.randint(6, 20))]
        for _ in range(3):
            words[rng.randrange(len(words))] = rng.choice(CUES[label])
        rows.append({"id": f"t{index}", "body": " ".join(words), "category": label})
    return pd.DataFrame(rows)


def table_config(tmp_path, path, *overrides):
    return load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [
            "data.source=table",
            f"data.path={path}",
            "data.text_column=body",
            "data.label_column=category",
            f"paths.data_dir={tmp_path / 'data'}",
            f"paths.reports_dir={tmp_path / 'reports'}",
            *overrides,
        ],
    )


def test_sort_labels_numeric_and_text():
    assert sort_labels(["10", "2", "1", "2"]) == ["1", "2", "10"]
    assert sort_labels(["pos", "neg", "mixed"]) == ["mixed", "neg", "pos"]


def test_three_class_task_end_to_end_with_string_labels(tmp_path):
    make_rows(360).to_csv(tmp_path / "reviews.csv", index=False)
    config = table_config(
        tmp_path,
        tmp_path / "reviews.csv",
        "training.epochs=25",
        "training.early_stopping_patience=5",
        "training.class_weights=true",
        "tokenizer.max_sequence_length=24",
    )
    out_dir = ingest.run(config)
    assert json.loads((out_dir / "labels.json").read_text()) == {"labels": ["bad", "good", "meh"]}
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sum(manifest["rows"].values()) == 360 and set(manifest["labels"]["test"]) == {"bad", "good", "meh"}
    tokenize.run(config)
    run_dir = train.run(config)
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    report = json.loads((evaluate.run(config, run=run_id) / "metrics.json").read_text())
    assert report["labels"] == ["bad", "good", "meh"]
    assert report["metrics"]["test_accuracy"] > 0.8
    for key in (
        "test_macro_f1",
        "test_weighted_f1",
        "test_roc_auc",
        "test_f1_meh",
        "test_precision_bad",
        "test_recall_good",
    ):
        assert key in report["metrics"]

    to_score = make_rows(30, seed=9).drop(columns="category")
    to_score.loc[4, "body"] = ""
    to_score.to_csv(tmp_path / "new.csv", index=False)
    score.run(
        config, tmp_path / "new.csv", tmp_path / "scored.csv", model_uri=f"runs:/{run_id}/model", text_column="body"
    )
    scored = pd.read_csv(tmp_path / "scored.csv", keep_default_na=False)
    assert list(scored.columns) == [
        "id",
        "body",
        "probability_bad",
        "probability_good",
        "probability_meh",
        "predicted_label",
        "score_error",
    ]
    assert scored["id"].tolist() == to_score["id"].tolist()
    assert set(scored["predicted_label"]) - {""} <= {"bad", "good", "meh"}
    assert scored.loc[4, "score_error"] and scored.loc[4, "predicted_label"] == ""
    truth = make_rows(30, seed=9)["category"]
    ok = scored["score_error"] == ""
    assert (scored.loc[ok, "predicted_label"] == truth[ok]).mean() > 0.8
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(
        pd.DataFrame({"text": ["superb brilliant loved"]})
    )
    assert pyfunc["predicted_label"].tolist() == ["good"]


def test_split_column_parquet_and_integer_labels(tmp_path):
    frame = make_rows(60)
    frame["category"] = frame["category"].map({"bad": 1, "meh": 3, "good": 5})
    frame["part"] = ["train"] * 40 + ["VAL "] * 10 + ["test"] * 10
    frame.to_parquet(tmp_path / "reviews.parquet", index=False)
    out_dir = ingest.run(table_config(tmp_path, tmp_path / "reviews.parquet", "data.split_column=part"))
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["rows"] == {"train": 40, "val": 10, "test": 10}
    assert json.loads((out_dir / "labels.json").read_text())["labels"] == ["1", "3", "5"]
    test = pd.read_parquet(out_dir / "test.parquet")
    assert test["source_file"].str.endswith(tuple(f":{n}" for n in range(51, 61))).all()


def test_folder_of_files_and_tsv(tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    rows = make_rows(90)
    rows.iloc[:45].to_csv(folder / "a.csv", index=False)
    rows.iloc[45:].to_csv(folder / "b.tsv", index=False, sep="\t")
    out_dir = ingest.run(table_config(tmp_path, folder))
    assert sum(json.loads((out_dir / "manifest.json").read_text())["rows"].values()) == 90


# ----------------------------------------------------------------------------- bad input


def assert_ingest_fails(config, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        ingest.run(config)
    assert not (config.data_dir / "ingest").exists()


def test_missing_text_or_label_column_lists_columns(tmp_path):
    make_rows(30).to_csv(tmp_path / "r.csv", index=False)
    assert_ingest_fails(
        table_config(tmp_path, tmp_path / "r.csv", "data.text_column=review"),
        r"r\.csv: no column 'review'; columns are \['id', 'body', 'category'\]",
    )
    assert_ingest_fails(table_config(tmp_path, tmp_path / "r.csv", "data.label_column=stars"), "no column 'stars'")


def test_empty_text_or_label_rows_are_dropped_and_reported(tmp_path, capsys):
    frame = make_rows(60)
    frame.loc[[2, 7], "body"] = "   "
    frame.loc[11, "category"] = ""
    frame.to_csv(tmp_path / "r.csv", index=False)
    out_dir = ingest.run(table_config(tmp_path, tmp_path / "r.csv"))
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["dropped_rows"]["count"] == 3
    assert manifest["dropped_rows"]["reasons"] == {"empty body": 2, "empty category": 1}
    assert any("row 3 " in e for e in manifest["dropped_rows"]["examples"])  # data row 3 = index 2
    assert sum(manifest["rows"].values()) == 57
    assert "dropped 3 row(s)" in capsys.readouterr().out


def test_label_in_test_never_seen_in_train(tmp_path):
    frame = make_rows(30)
    frame["part"] = ["train"] * 20 + ["test"] * 10
    frame.loc[25, "category"] = "surprise"
    frame.to_csv(tmp_path / "r.csv", index=False)
    assert_ingest_fails(
        table_config(tmp_path, tmp_path / "r.csv", "data.split_column=part"),
        r"1 test row\(s\) have a 'category' never seen in train: .*r\.csv:26 \('surprise'\)",
    )


def test_single_class_is_an_error(tmp_path):
    frame = make_rows(30)
    frame["category"] = "good"
    frame.to_csv(tmp_path / "r.csv", index=False)
    assert_ingest_fails(table_config(tmp_path, tmp_path / "r.csv"), "single class")


def test_unknown_split_values(tmp_path):
    frame = make_rows(30)
    frame["part"] = "train"
    frame.loc[5, "part"] = "holdout"
    frame.to_csv(tmp_path / "r.csv", index=False)
    assert_ingest_fails(
        table_config(tmp_path, tmp_path / "r.csv", "data.split_column=part"),
        r"r\.csv row 6: column 'part' has 'holdout'; allowed values are \['train', 'val', 'test'\]",
    )


def test_files_that_disagree_on_columns(tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    make_rows(20).to_csv(folder / "a.csv", index=False)
    make_rows(20).rename(columns={"body": "text"}).to_csv(folder / "b.csv", index=False)
    assert_ingest_fails(table_config(tmp_path, folder), r"b\.csv has columns .* but .*a\.csv has")


def test_no_matching_files(tmp_path):
    assert_ingest_fails(table_config(tmp_path, tmp_path / "nothing-*.csv"), "matches no .csv, .tsv or .parquet")


def test_table_source_needs_a_path():
    with pytest.raises(ValueError, match="needs data.path"):
        load_config(None, ["data.source=table"])


def test_shipped_multiclass_example_ingests(tmp_path):
    config = load_config(
        PROJECT_ROOT / "configs" / "example_multiclass.yaml",
        [
            f"data.path={PROJECT_ROOT / 'data' / 'examples' / 'product_reviews.csv'}",
            f"paths.data_dir={tmp_path / 'data'}",
        ],
    )
    manifest = json.loads((ingest.run(config) / "manifest.json").read_text())
    assert manifest["label_names"] == ["negative", "neutral", "positive"]
    assert sum(manifest["rows"].values()) == 180


def groups_of(out_dir, frame, split) -> set:
    rows = pd.read_parquet(out_dir / f"{split}.parquet")["source_file"].str.rsplit(":", n=1).str[1].astype(int)
    return set(frame["movie"].iloc[rows.to_numpy() - 1])


def test_a_group_column_keeps_each_group_on_one_side_of_every_split(tmp_path):
    frame = make_rows(240)
    frame["movie"] = [f"m{i // 4}" for i in range(len(frame))]  # 60 groups of 4 reviews
    frame.to_csv(tmp_path / "reviews.csv", index=False)
    grouped = ingest.run(
        table_config(
            tmp_path / "grouped", tmp_path / "reviews.csv", "data.group_column=movie", "data.validation_fraction=0.25"
        )
    )
    manifest = json.loads((grouped / "manifest.json").read_text())
    assert manifest["split_rule"] == "whole 'movie' groups, stratified by label, seeded"
    train, val, test = (groups_of(grouped, frame, split) for split in ("train", "val", "test"))
    assert train and val and test and not (train & val) and not (train & test) and not (val & test)
    # the control: without the column, the same data puts reviews of one movie on both sides
    plain = ingest.run(table_config(tmp_path / "plain", tmp_path / "reviews.csv", "data.validation_fraction=0.25"))
    assert groups_of(plain, frame, "train") & groups_of(plain, frame, "val")
    frame.loc[5, "movie"] = ""
    frame.to_csv(tmp_path / "blank.csv", index=False)
    assert_ingest_fails(
        table_config(tmp_path / "blank", tmp_path / "blank.csv", "data.group_column=movie"),
        r"blank.csv row 6: empty 'movie'",
    )


def test_the_own_data_config_works_as_copied_under_its_own_names(tmp_path):
    """configs/own_data.yaml copied to another name: its folders, experiment and registered model take that name
    ({config}), its model is the IMDB run's (no toy sizes), and as copied it ingests the example table."""
    work = Path.cwd()  # the test's own folder (isolated_workdir): the copy's relative paths land here
    shutil.copytree(PROJECT_ROOT / "data" / "examples", work / "data" / "examples")
    mine = tmp_path / "mine.yaml"
    shutil.copy(PROJECT_ROOT / "configs" / "own_data.yaml", mine)
    config, default = load_config(mine), load_config(PROJECT_ROOT / "configs" / "default.yaml")
    assert (config.data_dir, config.reports_dir) == (Path("data/mine"), Path("reports/mine"))
    assert config.tracking.registered_model_name == config.tracking.experiment_name == "mine-sentiment"
    others = [
        load_config(path)
        for path in (PROJECT_ROOT / "configs").glob("*.yaml")
        if path.name not in ("own_data.yaml", "tune.yaml")
    ]
    assert all(config.data_dir != other.data_dir for other in others)
    assert all(config.tracking.registered_model_name != other.tracking.registered_model_name for other in others)
    for section in ("tokenizer", "model", "training", "compare"):
        assert getattr(config, section) == getattr(default, section), section
    manifest = json.loads((ingest.run(config) / "manifest.json").read_text())
    assert (work / "data" / "mine" / "ingest" / "manifest.json").is_file()
    assert manifest["label_names"] == ["negative", "neutral", "positive"]
