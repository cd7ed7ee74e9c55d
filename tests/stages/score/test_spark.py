"""Spark batch scoring on a real local Spark (local[2]): same answers as `make score`, row for row."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from pipeline.__main__ import main as cli_main
from pipeline.core.errors import InputError, MissingInputError
from pipeline.stages import score
from pipeline.stages.score import spark
from tests.model.test_kinds import evaluated, fused_parts, grid_model  # noqa: F401  (fused_parts: a fixture)

REVIEWS = [
    "A superb, wonderful film.",
    "",
    'Awful and dull, "truly" awful.',
    "   ",
    "42",
    "Great acting,\nand a moving story.",
    "7 Samurai is a classic",
    "dull dull dull",
]


@pytest.fixture(scope="module")
def spark_setup(trained_run, tmp_path_factory):
    config, run_dir = trained_run
    config = config.replace(spark={"master": "local[2]"})
    model_uri = f"runs:/{json.loads((run_dir / 'manifest.json').read_text())['mlflow_run_id']}/model"
    folder = tmp_path_factory.mktemp("spark")
    frame = pd.DataFrame(
        {
            "id": [f"r{i}" for i in range(40)],
            "stars": [str(i % 10) for i in range(40)],
            "text": [
                REVIEWS[i % len(REVIEWS)] + ("" if i % len(REVIEWS) in (1, 3, 4) else f" #{i}") for i in range(40)
            ],
        }
    )
    frame.to_csv(folder / "reviews.csv", index=False)
    score.run(config, folder / "reviews.csv", folder / "expected.csv", model_uri=model_uri)
    expected = pd.read_csv(folder / "expected.csv", keep_default_na=False, dtype=str)
    yield config, model_uri, folder, frame, expected
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        SparkSession.getActiveSession().stop()


def as_csv(config):
    """``config`` writing CSV part files (``make score ENGINE=spark``'s ``--output-format csv``)."""
    return config.replace(spark={"output_format": "csv"})


def read_parts(folder, file_format: str) -> pd.DataFrame:
    """The part files in name order (Spark writes them in input order), as text like `make score` writes."""
    parts = sorted(p for p in folder.iterdir() if p.name.startswith("part-"))
    if file_format == "csv":
        return pd.concat([pd.read_csv(p, keep_default_na=False, dtype=str) for p in parts], ignore_index=True)
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def as_floats(values: pd.Series) -> pd.Series:
    """Probabilities as floats, NaN for an empty cell, a null or NaN."""
    return pd.Series([float("nan") if v is None or v == "" else float(v) for v in values.astype(object)])


def assert_matches(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert got["id"].tolist() == expected["id"].tolist()  # every row, in the input's order
    assert got["score_error"].fillna("").tolist() == expected["score_error"].tolist()
    assert got["predicted_label"].fillna("").tolist() == expected["predicted_label"].tolist()
    want, have = as_floats(expected["positive_probability"]), as_floats(got["positive_probability"])
    assert have.isna().tolist() == want.isna().tolist()
    assert have.dropna().tolist() == pytest.approx(want.dropna().tolist(), abs=1e-6)


def test_spark_scores_a_csv_like_make_score(spark_setup, capsys):
    config, model_uri, folder, frame, expected = spark_setup
    summary = spark.score_table(config, str(folder / "reviews.csv"), folder / "out_csv_input", model_uri=model_uri)
    assert (folder / "out_csv_input" / "_SUCCESS").is_file()
    got = read_parts(folder / "out_csv_input", "parquet")
    assert list(got.columns) == ["id", "stars", "text", "positive_probability", "predicted_label", "score_error"]
    assert str(got["positive_probability"].dtype) == "float64"  # a number column (nulls where no score), not text
    # quotes and line breaks intact; an empty CSV cell reads as null in Spark (an empty cell again in CSV output)
    assert got["text"].fillna("").tolist() == frame["text"].tolist()
    assert_matches(got, expected)
    assert summary["rows"] == 40 and summary["errors"] == int((expected["score_error"] != "").sum()) > 0
    assert "score (spark local[2]): read 40 rows from 1 csv file(s)" in capsys.readouterr().out
    assert not [p for p in folder.iterdir() if p.name.startswith(".out_csv_input")]  # no temporary folder left


def test_spark_scores_a_parquet_folder_to_csv_parts(spark_setup):
    config, model_uri, folder, frame, expected = spark_setup
    source = folder / "parquet_in"
    source.mkdir()
    frame.iloc[:25].to_parquet(source / "a.parquet", index=False)
    frame.iloc[25:].to_parquet(source / "b.parquet", index=False)
    spark.score_table(
        as_csv(config), str(source), folder / "out_parquet_input", model_uri=model_uri, keep_row_index=True
    )
    got = read_parts(folder / "out_parquet_input", "csv")
    assert_matches(got, expected)
    assert got["row_index"].astype(int).is_monotonic_increasing


def test_output_folder_is_refused_then_replaced_with_overwrite(spark_setup):
    config, model_uri, folder, frame, _ = spark_setup
    out = folder / "existing"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    with pytest.raises(InputError, match="exists: pass --overwrite"):
        spark.score_table(config, str(folder / "reviews.csv"), out, model_uri=model_uri)
    assert (out / "old.txt").read_text() == "keep me"
    frame.iloc[:5].to_csv(folder / "five.csv", index=False)
    spark.score_table(config, str(folder / "five.csv"), out, model_uri=model_uri, overwrite=True)
    assert not (out / "old.txt").exists() and len(read_parts(out, "parquet")) == 5


def test_bad_inputs_get_one_clear_line(spark_setup, tmp_path, capsys):
    config, model_uri, folder, frame, _ = spark_setup
    tmp_path = tmp_path / "inputs"  # a folder of the test's inputs alone (the test's own MLflow store is beside it)
    tmp_path.mkdir()
    with pytest.raises(MissingInputError, match="no files match"):
        spark.resolve_inputs(str(tmp_path / "nothing-*.csv"))
    frame.rename(columns={"text": "review"}).to_parquet(tmp_path / "no_text.parquet", index=False)
    with pytest.raises(InputError, match="no_text.parquet: no column 'text'"):
        spark.score_table(config, str(tmp_path / "no_text.parquet"), tmp_path / "out", model_uri=model_uri)
    frame.to_csv(tmp_path / "mixed.csv", index=False)
    with pytest.raises(InputError, match="mixes CSV and Parquet"):
        spark.resolve_inputs(str(tmp_path / "*"))
    assert not (tmp_path / "out").exists()
    # through the command line: one error line, exit status 2
    code = cli_main(
        [
            "score",
            "--engine",
            "spark",
            "--input",
            str(tmp_path / "none*.parquet"),
            "--output",
            str(tmp_path / "o"),
            "--model",
            model_uri,
        ]
    )
    assert code == 2 and capsys.readouterr().err.strip().startswith("error: no files match")


def test_missing_java_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(spark.PipelineError, match="Spark needs Java 17"):
        spark.require_java()
    assert os.environ["PATH"] == "/nonexistent"


@pytest.fixture
def spark_workers_stopped_after():
    """Stop the module's Spark session after the test: a Python worker that loaded a model logged with its own copy
    of an old ``pipeline`` package keeps that package in ``sys.modules``, and Spark reuses its workers, so the next
    test's model (today's ``pipeline.model.classifiers``) would be unpickled against the old one. The next
    ``score_table`` starts a new session with fresh workers."""
    yield
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        SparkSession.getActiveSession().stop()


@pytest.mark.parametrize("commit", ["43f75dd", "a765a9c"])
def test_spark_answers_like_the_code_that_logged_a_model_before_the_layout_change(
    spark_setup, tmp_path, commit, spark_workers_stopped_after
):
    from tests.stages.test_score_legacy_models import LEGACY, assert_rows

    config, legacy = spark_setup[0], LEGACY[commit]
    texts = legacy.csv_texts
    pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(tmp_path / "in.csv", index=False)
    spark.score_table(as_csv(config), str(tmp_path / "in.csv"), tmp_path / "out", model_uri=str(legacy.path))
    got = read_parts(tmp_path / "out", "csv")
    assert got["id"].astype(int).tolist() == list(range(len(texts)))  # every row, in order
    assert_rows(got.fillna("").to_dict("records"), legacy.rows(texts))


def assert_spark_answers_like_make_score(config, model_uri: str, folder, explain: bool = False) -> None:
    """REVIEWS scored by Spark (local[2]) and by `make score` with ``model_uri``: the same rows, in order (with
    ``explain``, the same explanations too)."""
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(len(REVIEWS))], "text": REVIEWS})
    frame.to_csv(folder / "in.csv", index=False)
    score.run(config, folder / "in.csv", folder / "expected.csv", model_uri=model_uri, explain_top=3 if explain else 0)
    expected = pd.read_csv(folder / "expected.csv", keep_default_na=False, dtype=str)
    spark.score_table(
        as_csv(config), str(folder / "in.csv"), folder / "out", model_uri=model_uri, explain_top=3 if explain else 0
    )
    got = read_parts(folder / "out", "csv")
    assert_matches(got, expected)
    if explain:
        assert list(got.columns)[-1] == "explanation"
        assert got["explanation"].tolist() == expected["explanation"].tolist()
        assert (expected["explanation"] != "").sum() == (expected["score_error"] == "").sum()


def test_spark_scores_and_explains_with_a_fused_model_like_make_score(spark_setup, comparison, tmp_path):
    """A fused champion candidate (Transformer + NBSVM in one pyfunc) answers on Spark as `make score` does,
    explanations (the model's `explain` request option) included."""
    compare_config, _ = comparison
    run_id = json.loads((compare_config.reports_dir / "comparison.json").read_text())["summary"]["nbsvm+first_token"][
        "run_ids"
    ][0]
    config = spark_setup[0].replace(tracking={"tracking_uri": compare_config.tracking.tracking_uri})
    assert_spark_answers_like_make_score(config, f"runs:/{run_id}/model", tmp_path, explain=True)


def test_spark_scores_with_a_model_fine_tuned_from_a_preset_like_make_score(spark_setup, preset_comparison, tmp_path):
    """A pretrained preset's fine-tuned model (its preset folder deleted) answers on Spark as `make score` does."""
    config = preset_comparison.replace(spark={"master": "local[2]"})
    run_id = json.loads((config.reports_dir / "comparison.json").read_text())["summary"]["mean"]["run_ids"][0]
    assert_spark_answers_like_make_score(config, f"runs:/{run_id}/model", tmp_path)


def test_spark_gives_the_evaluations_answers_for_a_cascade_at_the_weights_a_user_gets(
    spark_setup,
    fused_parts,  # noqa: F811  (the fixture imported above)
    tmp_path,
):
    """The weight-grid check of tests/model/test_kinds.py through `make score ENGINE=spark` (this module's local
    Spark): the fused models of the grid's end and a middle weight, cascaded, give the evaluation's probabilities within
    1e-6, every row in order."""
    config, run_id, _, parts = fused_parts
    config = config.replace(spark={"master": "local[2]"})
    texts = parts["test"][0]
    pd.DataFrame({"id": range(len(texts)), "text": texts}).to_csv(tmp_path / "in.csv", index=False)
    for weight in (1.0, 0.3):
        expected, threshold = evaluated(parts, weight, 0.1)
        model = grid_model(run_id, tmp_path / f"model-{weight:g}", weight, threshold)
        out = tmp_path / f"out-{weight:g}"
        spark.score_table(config, str(tmp_path / "in.csv"), out, model_uri=str(model))
        got = pd.concat([pd.read_parquet(part) for part in sorted(out.glob("part-*"))], ignore_index=True)
        assert got["id"].astype(int).tolist() == list(range(len(texts)))  # every row, in the input's order
        np.testing.assert_allclose(got["positive_probability"], expected[:, 1], atol=1e-6)
