"""One answer per row, whatever the client: `make score`, `make serve`'s server over HTTP (MLflow's scoring server
behind the front of `pipeline.stages.serve.app`), `mlflow models predict`; and the server's answers to requests it
refuses (`pipeline.stages.serve.validation`), over real HTTP."""

import http.client
import io
import json
import os
import subprocess
import sys
import urllib.parse

import mlflow
import pandas as pd
import pytest

from pipeline.core.errors import ConfigError
from pipeline.stages import score
from pipeline.stages.serve.command import serve_command
from pipeline.stages.serve.validation import RequestLimits, RequestProblem, check_request
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


def test_make_serves_server_answers_like_make_score(logged_model, make_score_answer, tmp_path):
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
    """SERVE_HOST: uvicorn's `--host` gets it; on every address (0.0.0.0) the curl line asks this one. SERVE_WORKERS
    and the limits reach the server's command and environment."""
    from pipeline.__main__ import main as cli_main
    from pipeline.stages import serve
    from pipeline.stages.serve.command import MAX_BODY_ENV, MAX_ROWS_ENV, MODEL_ENV

    uri = logged_model[1]
    started = []

    def run(command, env, check):
        started.append((command, env))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(serve.subprocess, "run", run)
    arguments = ["serve", "--host", "0.0.0.0", "--port", "5123", "--model", uri, "--workers", "2", "--max-rows", "7"]
    assert cli_main(arguments) == 0
    ((command, env),) = started
    assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "5123"
    assert command[command.index("--workers") + 1] == "2"
    assert (env[MODEL_ENV], env[MAX_ROWS_ENV], env[MAX_BODY_ENV]) == (uri, "7", "8000000")
    out = capsys.readouterr().out
    assert "at http://0.0.0.0:5123/invocations" in out and "curl -s http://127.0.0.1:5123/invocations" in out
    assert "GET http://127.0.0.1:5123/ describes the model" in out and "at most 8,000,000 bytes and 7 rows" in out


def test_the_command_line_defaults_are_the_limits_defaults_and_bad_limits_are_config_errors():
    from pipeline.__main__ import build_parser

    args = build_parser().parse_args(["serve"])
    defaults = RequestLimits()
    assert (args.max_body_bytes, args.max_rows, args.workers) == (defaults.max_body_bytes, defaults.max_rows, 1)
    with pytest.raises(ConfigError, match="--max-rows must be a whole number of at least 1, not 0"):
        RequestLimits(max_rows=0)
    with pytest.raises(ConfigError, match="--workers"):
        serve_command(5001, workers=0)


LIMITS = RequestLimits(max_body_bytes=2_000, max_rows=3)
RECORD = {"text": "A fine film."}


@pytest.mark.parametrize(
    ("content_type", "body", "rows"),
    [
        ("application/json", {"dataframe_records": [RECORD, {"text": None}, {"text": 42}]}, 3),
        ("application/json; charset=UTF-8", {"dataframe_records": [RECORD], "params": {"explain": True}}, 1),
        ("application/json", {"dataframe_split": {"columns": ["id", "text"], "data": [[1, "a"], [2, "b"]]}}, 2),
        ("application/json", {"dataframe_split": {"columns": ["text"], "data": ["a", "b"]}}, 2),
        ("application/json", {"inputs": ["a", "b"]}, 2),
        ("application/json", {"inputs": {"text": ["a", "b", "c"]}}, 3),
        ("application/json", {"inputs": {"text": "a"}}, 1),
        ("application/json", {"instances": [RECORD]}, 1),
        ("text/csv", b"id,text\n1,a\n2,\n", 2),
    ],
)
def test_the_request_forms_mlflow_scores_pass_with_their_row_count(content_type, body, rows):
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert check_request(content_type, body, LIMITS) == rows


def parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("content_type", "body", "status", "message"),
    [
        ("application/json", b'{"dataframe_records": [', 400, "the body is not JSON: Expecting value at line 1"),
        ("application/json", b'{"dataframe_records": [{"text": "\xff"}]}', 400, "not UTF-8: byte 33 is 0xff"),
        ("application/json", {"dataframe_records": []}, 400, "no rows"),
        (
            "application/json",
            {"dataframe_records": [RECORD, {"review": "x"}]},
            400,
            "dataframe_records[1] has no 'text'",
        ),
        ("application/json", {"dataframe_records": ["x"]}, 400, "dataframe_records[0] must be an object"),
        ("application/json", {"dataframe_records": RECORD}, 400, "dataframe_records must be a list"),
        ("application/json", [RECORD], 400, "must be a JSON object with one of dataframe_records"),
        ("application/json", {"dataframe_record": [RECORD]}, 400, "exactly one of dataframe_records, dataframe_split"),
        ("application/json", {"inputs": [], "dataframe_records": []}, 400, "it has ['dataframe_records', 'inputs']"),
        ("application/json", {"dataframe_records": [RECORD], "params": [1]}, 400, "params must be an object"),
        ("application/json", {"dataframe_split": {"columns": ["review"], "data": []}}, 400, "has no 'text' column"),
        ("application/json", {"dataframe_split": {"columns": ["text", "id"], "data": [["a"]]}}, 400, "data[0] has 1"),
        ("application/json", {"inputs": {"review": ["a"]}}, 400, "inputs has no 'text' field; it has ['review']"),
        ("application/json", {"inputs": [RECORD, {"x": 1}]}, 400, "inputs[1] has no 'text' field"),
        ("application/json", {"inputs": []}, 400, "no rows"),
        ("application/json", {"dataframe_records": [RECORD] * 4}, 413, "4 rows; this server takes at most 3 rows"),
        ("application/json", {"inputs": ["x" * 2_000]}, 413, "2,016 bytes; this server takes at most 2,000"),
        ("text/csv", b"review\nx\n", 400, "the table has no 'text' column; it has ['review']"),
        ("text/csv", b"text\n", 400, "no rows"),
        ("text/csv", b"", 400, "no rows: the CSV body is empty"),
        ("application/vnd.apache.parquet", parquet(pd.DataFrame({"review": ["x"]})), 400, "no 'text' column"),
        ("application/vnd.apache.parquet", b"not parquet", 400, "the body is not a vnd.apache.parquet table"),
        ("text/plain", b"A fine film.", 415, "Content-Type 'text/plain' is not one this server reads"),
        (None, b"A fine film.", 415, "Content-Type '(none)'"),
        ("application/json; charset=latin-1", {"inputs": ["a"]}, 415, "'charset=latin-1': this server reads UTF-8"),
    ],
)
def test_a_refused_request_gets_its_status_and_a_one_line_message_naming_the_problem(
    content_type, body, status, message
):
    body = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestProblem) as refused:
        check_request(content_type, body, LIMITS)
    assert refused.value.status == status and message in refused.value.message
    assert refused.value.body().count(b"\n") == 1 and set(json.loads(refused.value.body())) == {"error_code", "message"}


def post(base: str, body: bytes | None, content_type: str | None = "application/json", path: str = "/invocations"):
    """One request on its own connection: ``(status, body)`` (``body`` None: a GET)."""
    address = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request("GET" if body is None else "POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_the_served_model_describes_itself_refuses_bad_requests_clearly_and_keeps_answering(
    logged_model, make_score_answer
):
    """Real HTTP, two workers: `GET /`, then every kind of bad request (each a 4xx with one JSON line naming the
    problem), then the good request, answered as `make score` answers it."""
    from pipeline.model.classifiers import load_classifier

    config, model_uri = logged_model
    labels = load_classifier(model_uri).labels
    good = json.dumps({"dataframe_records": [{"text": text} for text in ROWS]}).encode()
    bad = [
        (b'{"dataframe_records": [{"text": "A fine', "application/json", 400, "the body is not JSON"),
        (json.dumps({"dataframe_records": [{"review": "x"}]}).encode(), "application/json", 400, "has no 'text' field"),
        (json.dumps({"dataframe_records": []}).encode(), "application/json", 400, "no rows"),
        (b"A fine film.", "text/plain", 415, "Content-Type 'text/plain'"),
        (b'{"dataframe_records": [{"text": "\xff\xfe"}]}', "application/json", 400, "the body is not UTF-8"),
        (json.dumps({"inputs": ["x" * 100_001]}).encode(), "application/json", 413, "at most 100,000 bytes"),
        (json.dumps({"inputs": ["x"] * 11}).encode(), "application/json", 413, "11 rows; this server takes at most 10"),
    ]
    with model_server(model_uri, config.tracking.tracking_uri, workers=2, max_body_bytes=100_000, max_rows=10) as base:
        root_status, root = post(base, None, path="/")
        answers = [post(base, body, content_type) for body, content_type, _, _ in bad]
        good_status, answer = post(base, good)
        ping_status, _ = post(base, None, path="/ping")
    page = json.loads(root)
    assert root_status == 200 and page["labels"] == labels and page["model"] == model_uri
    assert page["limits"]["max_body_bytes"] == 100_000 and page["limits"]["max_rows"] == 10
    for (_, _, status, message), (got_status, got) in zip(bad, answers):
        assert got_status == status and got.count(b"\n") == 1, got
        assert message in json.loads(got)["message"] and json.loads(got)["error_code"]
    assert good_status == 200 and ping_status == 200
    assert_same_rows(json.loads(answer)["predictions"], make_score_answer)
