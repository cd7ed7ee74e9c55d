"""Models logged before an upgrade keep answering the same: a user's registered champion survives it.

``tests/data/legacy_pyfunc_model`` was logged by the pipeline before its modules moved into
``pipeline/stages/`` (see ``tests/data/legacy_pyfunc_model.md``); ``legacy_pyfunc_expected.json`` holds what
that code answered. Today's code must give the same rows through every client.
"""

import json

import mlflow
import pandas as pd
import pytest

from pipeline.stages import score, serve
from tests.conftest import PROJECT_ROOT

LEGACY_PYFUNC = PROJECT_ROOT / "tests" / "data" / "legacy_pyfunc_model"
EXPECTED = json.loads((PROJECT_ROOT / "tests" / "data" / "legacy_pyfunc_expected.json").read_text())
CSV_TEXTS = [text for text in EXPECTED["texts"] if text is not None]  # a CSV cell cannot hold None


def expected_rows(texts) -> list[dict]:
    by_text = {text: i for i, text in enumerate(EXPECTED["texts"]) if text is not None}
    return [{key: EXPECTED[key][by_text[text]] for key in ("positive_probability", "predicted_label", "score_error")}
            for text in texts]


def assert_rows(got: list[dict], want: list[dict]) -> None:
    assert [row["score_error"] for row in got] == [row["score_error"] for row in want]
    assert [row["predicted_label"] for row in got] == [row["predicted_label"] for row in want]
    for have, expected in zip(got, want):
        if expected["positive_probability"] is None:
            assert have["positive_probability"] in (None, "")
        else:
            assert float(have["positive_probability"]) == pytest.approx(expected["positive_probability"], abs=1e-6)


def test_the_legacy_model_carries_the_old_layout():
    """The control: this really is a model of the flat layout, so the tests below test an upgrade."""
    code = LEGACY_PYFUNC / "code" / "pipeline"
    assert (code / "tokenization.py").is_file() and not (code / "stages").exists()


def test_make_score_answers_like_the_code_that_logged_it(smoke_config, tmp_path):
    pd.DataFrame({"text": CSV_TEXTS}).to_csv(tmp_path / "in.csv", index=False)
    score.run(smoke_config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=str(LEGACY_PYFUNC))
    scored = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, dtype=str)
    assert scored["text"].tolist() == CSV_TEXTS
    assert_rows(scored.to_dict("records"), expected_rows(CSV_TEXTS))


def test_a_registered_champion_logged_before_the_upgrade_is_still_the_default_model(smoke_config, tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'store.db'}"
    config = smoke_config.replace(tracking={"tracking_uri": tracking_uri})
    client = mlflow.tracking.MlflowClient(tracking_uri)
    name = config.tracking.registered_model_name
    client.create_registered_model(name)
    version = client.create_model_version(name, source=str(LEGACY_PYFUNC))
    client.set_registered_model_alias(name, "champion", version.version)
    pd.DataFrame({"text": CSV_TEXTS}).to_csv(tmp_path / "in.csv", index=False)
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv")  # no model: the champion
    scored = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, dtype=str)
    assert_rows(scored.to_dict("records"), expected_rows(CSV_TEXTS))


def test_mlflow_models_serve_answers_like_the_code_that_logged_it(smoke_config):
    with serve.model_server(str(LEGACY_PYFUNC), f"sqlite:///{smoke_config.data_dir.parent / 'serve.db'}") as base:
        answer = serve.invoke(base, [{"text": text} for text in EXPECTED["texts"]])
    want = [{key: EXPECTED[key][i] for key in ("positive_probability", "predicted_label", "score_error")}
            for i in range(len(EXPECTED["texts"]))]
    assert_rows(answer, want)
