"""One answer per row, whatever the client: `make score`, `mlflow models serve` over HTTP, `mlflow models predict`."""

import json
import os
import subprocess
import sys

import mlflow
import pandas as pd
import pytest

from pipeline.stages import score
from tests.served_model import invoke, model_server

# what a user may send: reviews, and values that cannot be scored
ROWS = ["A superb, wonderful film.", "", "   ", "42", "Awful and dull from start to end.", "7 Samurai is a classic"]


@pytest.fixture(scope="module")
def logged_model(trained_run):
    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return config, f"runs:/{manifest['mlflow_run_id']}/model"


@pytest.fixture(scope="module")
def make_score_answer(logged_model, tmp_path_factory):
    config, model_uri = logged_model
    folder = tmp_path_factory.mktemp("serving")
    pd.DataFrame({"text": ROWS}).to_csv(folder / "in.csv", index=False)
    score.run(config, folder / "in.csv", folder / "out.csv", model_uri=model_uri)
    return pd.read_csv(folder / "out.csv", keep_default_na=False, dtype=str)


def assert_same_rows(answer: list[dict], expected: pd.DataFrame) -> None:
    assert len(answer) == len(expected)
    for got, want in zip(answer, expected.to_dict("records")):
        assert got["score_error"] == want["score_error"]
        assert got["predicted_label"] == want["predicted_label"]
        if want["score_error"]:
            assert got["positive_probability"] is None  # JSON null, not NaN
        else:
            assert got["positive_probability"] == pytest.approx(float(want["positive_probability"]), abs=1e-6)


def test_make_score_flags_the_unscorable_rows(make_score_answer):
    assert make_score_answer["score_error"].tolist() == [
        "",
        "missing or empty text",
        "whitespace-only text",
        "not text (a number)",
        "",
        "",
    ]


def test_mlflow_models_serve_answers_like_make_score(logged_model, make_score_answer, tmp_path):
    config, model_uri = logged_model
    with model_server(model_uri, config.tracking.tracking_uri) as base:
        answer = invoke(base, [{"text": text} for text in ROWS])
        missing = invoke(base, [{"text": None}, {"text": "A superb, wonderful film."}])
        explained = invoke(base, [{"text": text} for text in ROWS], params={"explain": True})
    assert_same_rows(answer, make_score_answer)
    assert "explanation" not in answer[0]
    # the request option `explain`: the explanation column `make score EXPLAIN=1` writes, "" on the error rows
    pd.DataFrame({"text": ROWS}).to_csv(tmp_path / "in.csv", index=False)
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=model_uri, explain_top=5)
    expected = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, dtype=str)
    assert_same_rows(explained, expected)
    assert [row["explanation"] for row in explained] == expected["explanation"].tolist()
    assert expected["explanation"][0] != "" and expected["explanation"][1] == ""
    assert missing[0]["score_error"] == "missing or empty text" and missing[0]["predicted_label"] == ""
    assert missing[1] == answer[0]


def test_mlflow_models_predict_answers_like_make_score(logged_model, make_score_answer, tmp_path):
    config, model_uri = logged_model
    (tmp_path / "in.json").write_text(json.dumps({"dataframe_records": [{"text": t} for t in ROWS]}))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "predict",
            "-m",
            model_uri,
            "-i",
            str(tmp_path / "in.json"),
            "-t",
            "json",
            "-o",
            str(tmp_path / "out.json"),
            "--env-manager",
            "local",
        ],
        check=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": config.tracking.tracking_uri},
        capture_output=True,
    )
    answer = json.loads((tmp_path / "out.json").read_text())["predictions"]
    assert_same_rows(answer, make_score_answer)


def test_pyfunc_in_process_answers_like_make_score(logged_model, make_score_answer):
    config, model_uri = logged_model
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    frame = mlflow.pyfunc.load_model(model_uri).predict(pd.DataFrame({"text": ROWS}))
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    assert_same_rows(records, make_score_answer)
    assert frame["positive_probability"].iloc[1] is None


def test_make_serve_listens_on_the_host_it_is_given_and_prints_a_curl_line_that_reaches_it(
    logged_model, monkeypatch, capsys
):
    """SERVE_HOST: `mlflow models serve --host` gets it; on every address (0.0.0.0) the curl line asks this one."""
    from pipeline.__main__ import main as cli_main
    from pipeline.stages import serve

    uri = logged_model[1]
    started = []

    def run(command, env, check):
        started.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(serve.subprocess, "run", run)
    assert cli_main(["serve", "--host", "0.0.0.0", "--port", "5123", "--model", uri]) == 0
    (command,) = started
    assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "5123"
    out = capsys.readouterr().out
    assert "at http://0.0.0.0:5123/invocations" in out and "curl -s http://127.0.0.1:5123/invocations" in out
