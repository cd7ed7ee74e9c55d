import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.__main__ import main as cli_main
from pipeline.stages import score
from pipeline.stages.score import csv_file as scoring
from pipeline.text.conventions import text_problem


@pytest.fixture(scope="module")
def model(trained_run):
    config, run_dir = trained_run
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    uri = f"runs:/{run_id}/model"
    return config, uri, scoring.load_classifier(uri)


@pytest.fixture
def fast_model(model, monkeypatch):
    """Load the pyfunc model once per module instead of once per scoring run."""
    config, uri, classifier = model
    monkeypatch.setattr(scoring, "load_classifier", lambda _uri: classifier)
    return config, uri, classifier


def read_output(path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


BAD_TEXTS = ["", "   ", "\n\t", "42", "-3.5e2"]
review_text = st.one_of(
    st.sampled_from(BAD_TEXTS),
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from([",", '"', "\n", " "]),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from(["A superb, wonderful film.", 'He said "awful", then left.', "dull\nand\nboring"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(review_text, min_size=1, max_size=30), chunk_size=st.integers(1, 7))
def test_every_row_kept_in_order_with_errors_for_bad_text(fast_model, tmp_path, texts, chunk_size):
    config, uri, _ = fast_model
    source = pd.DataFrame({"id": [f"r{i}" for i in range(len(texts))], "text": texts, "extra": "keep, me"})
    source_path, output_path = tmp_path / "in.csv", tmp_path / "out.csv"
    source.to_csv(source_path, index=False)
    expected_texts = pd.read_csv(source_path, dtype=str, keep_default_na=False)["text"].tolist()
    summary = score.run(config, source_path, output_path, model_uri=uri, chunk_size=chunk_size)
    out = read_output(output_path)
    assert out["id"].tolist() == source["id"].tolist()
    assert out["text"].tolist() == expected_texts and (out["extra"] == "keep, me").all()
    assert list(out.columns) == ["id", "text", "extra", "positive_probability", "predicted_label", "score_error"]
    bad = np.array([text_problem(t) != "" for t in expected_texts])
    assert ((out["score_error"] != "") == bad).all()
    assert (out.loc[bad, "positive_probability"] == "").all() and (out.loc[bad, "predicted_label"] == "").all()
    good = out.loc[~bad]
    assert good["positive_probability"].astype(float).between(0, 1).all()
    assert good["predicted_label"].isin(["positive", "negative"]).all()
    assert summary["rows"] == len(texts) and summary["errors"] == int(bad.sum())


def test_shuffling_rows_does_not_change_any_score(fast_model, tmp_path):
    config, uri, _ = fast_model
    rng = np.random.default_rng(0)
    words = ["superb", "awful", "plot", "movie", "wonderful", "boring", "the", "ending"]
    texts = [" ".join(rng.choice(words, rng.integers(1, 40))) for _ in range(200)]
    frame = pd.DataFrame({"id": range(200), "text": texts})
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.sample(frac=1, random_state=1).to_csv(tmp_path / "b.csv", index=False)
    score.run(config, tmp_path / "a.csv", tmp_path / "a_out.csv", model_uri=uri, chunk_size=64)
    score.run(config, tmp_path / "b.csv", tmp_path / "b_out.csv", model_uri=uri, chunk_size=50)
    a = pd.read_csv(tmp_path / "a_out.csv").set_index("id")["positive_probability"]
    b = pd.read_csv(tmp_path / "b_out.csv").set_index("id")["positive_probability"]
    # XLA may sum in another order when a row shares its batch with other rows: float32 noise, far below 1e-5
    np.testing.assert_allclose(a.sort_index(), b.sort_index(), atol=1e-5)


def test_score_agrees_with_pyfunc(model, tmp_path):
    config, uri, _ = model
    texts = ["A wonderful superb film.", "Boring and awful.", "the plot of the movie " * 30]
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "in.csv", index=False)
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri)
    scored = pd.read_csv(tmp_path / "out.csv")
    direct = mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"text": texts}))
    np.testing.assert_allclose(scored["positive_probability"], direct["positive_probability"], atol=1e-6)
    assert scored["predicted_label"].tolist() == direct["predicted_label"].tolist()


def test_interrupted_write_leaves_no_output(fast_model, tmp_path, monkeypatch):
    config, uri, _ = fast_model
    tmp_path = tmp_path / "io"
    tmp_path.mkdir()
    pd.DataFrame({"text": ["good film"] * 10}).to_csv(tmp_path / "in.csv", index=False)
    output = tmp_path / "out.csv"
    output.write_text("previous results\n")
    real_finish_chunk = scoring.finish_chunk
    calls = []

    def interrupt_on_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_finish_chunk(*args, **kwargs)

    monkeypatch.setattr(scoring, "finish_chunk", interrupt_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        score.run(config, tmp_path / "in.csv", output, model_uri=uri, chunk_size=3)
    assert output.read_text() == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.csv"]


def test_undecodable_check_finds_escaped_bytes_in_any_cell():
    assert scoring.has_undecodable(["fine", "caf\udce9", "also fine"])
    assert not scoring.has_undecodable(["fine", "café", "😀", None, 3.5])
    assert not scoring.has_undecodable([])


def test_bom_quotes_and_other_encodings(fast_model, tmp_path):
    config, uri, _ = fast_model
    frame = pd.DataFrame({"text": ['Café, "superb"\nreally', "awful, dull"], "n": ["1", "2"]})
    frame.to_csv(tmp_path / "bom.csv", index=False, encoding="utf-8-sig")
    score.run(config, tmp_path / "bom.csv", tmp_path / "bom_out.csv", model_uri=uri)
    out = read_output(tmp_path / "bom_out.csv")
    assert list(out.columns)[:2] == ["text", "n"] and out["text"].tolist() == frame["text"].tolist()
    frame.to_csv(tmp_path / "latin.csv", index=False, encoding="latin-1")
    score.run(config, tmp_path / "latin.csv", tmp_path / "latin_out.csv", model_uri=uri, encoding="latin-1")
    assert read_output(tmp_path / "latin_out.csv")["text"].tolist() == frame["text"].tolist()


def test_undecodable_bytes_are_reported_with_row_number(fast_model, tmp_path):
    config, uri, _ = fast_model
    (tmp_path / "bad.csv").write_bytes(b"text\ngood film\nbad \xff\xfe bytes\nfine\n")
    summary = score.run(config, tmp_path / "bad.csv", tmp_path / "out.csv", model_uri=uri)
    out = read_output(tmp_path / "out.csv")
    assert len(out) == 3 and summary["errors"] == 1
    assert out["score_error"].tolist()[0] == out["score_error"].tolist()[2] == ""
    assert "row 2" in out["score_error"][1] and "undecodable" in out["score_error"][1]


def test_missing_column_lists_existing_columns(fast_model, tmp_path, capsys):
    config, uri, _ = fast_model
    pd.DataFrame({"review": ["x"], "stars": [5]}).to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ValueError, match=r"no column 'text'; columns are \['review', 'stars'\]"):
        score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri)
    assert not (tmp_path / "out.csv").exists()
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri, text_column="review")
    assert len(read_output(tmp_path / "out.csv")) == 1


def test_bad_model_uri_is_named(trained_run, tmp_path, capsys):
    pd.DataFrame({"text": ["x"]}).to_csv(tmp_path / "in.csv", index=False)
    code = cli_main(
        [
            "score",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.csv"),
            "--model",
            "models:/no-such-model@champion",
        ]
    )
    assert code == 2
    assert "models:/no-such-model@champion" in capsys.readouterr().err
    assert not (tmp_path / "out.csv").exists()


def test_refuses_to_overwrite_input(fast_model, tmp_path):
    config, uri, _ = fast_model
    pd.DataFrame({"text": ["x"]}).to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ValueError, match="refusing to overwrite the input"):
        score.run(config, tmp_path / "in.csv", tmp_path / "in.csv", model_uri=uri)


EXPLAINED = [
    "A superb, wonderful film.",
    "",
    "Awful and dull, truly awful.",
    "42",
    "superb " * 300,
    "Great acting, and a moving story.",
]


def test_explain_adds_the_words_behind_every_scored_row_and_keeps_the_error_rows(model, tmp_path, capsys):
    """`make score EXPLAIN=1` (the CLI's --explain): one column more, "" on the error rows, the scored rows' items
    signed words of their own text; the pyfunc model's `explain` request option answers the same."""
    config, uri, _ = model
    pd.DataFrame({"id": range(len(EXPLAINED)), "text": EXPLAINED}).to_csv(tmp_path / "in.csv", index=False)
    code = cli_main(
        [
            "score",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.csv"),
            "--model",
            uri,
            "--explain",
            "--explain-top",
            "3",
            "--chunk-size",
            "2",
            "--set",
            f"tracking.tracking_uri={config.tracking.tracking_uri}",
        ]
    )
    assert code == 0
    out = read_output(tmp_path / "out.csv")
    assert list(out.columns) == ["id", "text", "positive_probability", "predicted_label", "score_error", "explanation"]
    assert out["id"].tolist() == [str(i) for i in range(len(EXPLAINED))]
    bad = out["score_error"] != ""
    assert bad.tolist() == [False, True, False, True, False, False]
    assert (out.loc[bad, "explanation"] == "").all()
    for text, explanation in zip(out.loc[~bad, "text"], out.loc[~bad, "explanation"]):
        items = explanation.split(", ")
        assert 1 <= len(items) <= 3 and all(item[0] in "+-" and item[1:] in text.lower() for item in items)
    assert "scored and explained (explanation: top 3)" in capsys.readouterr().out
    plain = score.run(config, tmp_path / "in.csv", tmp_path / "plain.csv", model_uri=uri)
    assert plain["rows"] == len(EXPLAINED) and "explanation" not in read_output(tmp_path / "plain.csv").columns
    np.testing.assert_allclose(
        read_output(tmp_path / "plain.csv")["positive_probability"].replace("", "nan").astype(float),
        out["positive_probability"].replace("", "nan").astype(float),
        atol=1e-6,
    )
    served = mlflow.pyfunc.load_model(uri).predict(
        pd.DataFrame({"text": EXPLAINED}), params={"explain": True, "explain_top": 3}
    )
    assert served["explanation"].tolist() == out["explanation"].tolist()
    assert "explanation" not in mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"text": EXPLAINED})).columns


def test_explain_top_must_be_positive(fast_model, tmp_path):
    config, uri, _ = fast_model
    pd.DataFrame({"text": ["good film"]}).to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ValueError, match=r"--explain-top must be 0 \(no explanations\) or more"):
        score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri, explain_top=-1)
    code = cli_main(
        [
            "score",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.csv"),
            "--model",
            uri,
            "--explain",
            "--explain-top",
            "0",
        ]
    )
    assert code == 2
    assert not (tmp_path / "out.csv").exists()


def test_the_progress_bar_counts_the_input_bytes_so_it_can_say_what_is_left(fast_model, tmp_path, capsys):
    config, uri, _ = fast_model
    pd.DataFrame({"text": ["A superb film, truly wonderful."] * 300}).to_csv(tmp_path / "in.csv", index=False)
    size = (tmp_path / "in.csv").stat().st_size
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri, chunk_size=50)
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    last = [line for line in final if line.startswith("scoring in.csv")][-1]
    assert "100%" in last and f"{size / 1000:.1f}k/{size / 1000:.1f}k" in last and "300 rows" in last
