"""What a user sees in the MLflow UI, checked in a real browser (Debian's chromium through Playwright).

The server runs over the tiny comparison's own store on a free 127.0.0.1 port; screenshots go to the
test's temporary folder.
"""

import mlflow
import pytest

from lab.experiments import ui_screenshots
from pipeline.__main__ import main as cli_main
from pipeline.stages.ui import links as ui
from pipeline.tracking import DESCRIPTION_TAG, EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tests.conftest import PROJECT_ROOT

# text MLflow 3.17's GenAI overview shows, which the runs table does not
GENAI_OVERVIEW_MARKERS = ("No data available for the selected time range", "Detect Issues")

SMOKE = str(PROJECT_ROOT / "configs" / "smoke.yaml")


def test_setup_tracking_makes_any_experiment_a_model_training_one(smoke_config):
    """An experiment made elsewhere (the control: it lacks the tag) gets it from setup_tracking; so does the
    comparison's, which setup_tracking created."""
    from pipeline.tracking import setup_tracking, tracking_uri

    client = mlflow.tracking.MlflowClient(tracking_uri(smoke_config.tracking))  # the store setup_tracking points at
    made_elsewhere = client.create_experiment("made-elsewhere")
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(made_elsewhere).tags
    elsewhere = smoke_config.replace(tracking={"experiment_name": "made-elsewhere"}).tracking
    assert setup_tracking(elsewhere) == made_elsewhere
    assert client.get_experiment(made_elsewhere).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    new_one = smoke_config.replace(tracking={"experiment_name": "new-one"}).tracking
    fresh = client.get_experiment(setup_tracking(new_one))
    assert fresh.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND


def test_parent_and_children_describe_themselves(comparison):
    config, report = comparison
    found = ui.latest_comparison(config.tracking)
    client = mlflow.tracking.MlflowClient()
    note = client.get_run(found.parent_id).data.tags[DESCRIPTION_TAG]
    verdict = report.read_text().split("## Verdict", 1)[1].strip()
    assert verdict in note
    assert "| `first_token` | transformer | 2 |" in note and "TF-IDF + logistic regression (reference)" in note
    assert "| NBSVM (1-3-gram naive-Bayes logistic regression) | nbsvm | 1 |" in note
    transformers = [run_id for run_id in found.child_ids if "model.pooling" in client.get_run(run_id).data.params]
    assert len(transformers) == 4
    for run_id in transformers:
        run = client.get_run(run_id)
        description = run.data.tags[DESCRIPTION_TAG]
        assert f"seed {run.data.params['training.seed']}" in description
        assert f"pooling={run.data.params['model.pooling']}" in description and found.parent_id in description


def test_make_ui_prints_the_latest_comparison_link(comparison, capsys):
    config, _ = comparison
    found = ui.latest_comparison(config.tracking)
    assert (
        cli_main(
            [
                "ui",
                "--config",
                SMOKE,
                "--set",
                f"tracking.tracking_uri={config.tracking.tracking_uri}",
                "--port",
                "5123",
                "--print-only",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        f"http://127.0.0.1:5123/#/experiments/{found.experiment_id}/runs/{found.parent_id}?"
        f"workflowType=machine_learning" in out
    )
    assert f"/#/experiments/{found.experiment_id}/runs?workflowType=machine_learning" in out


def test_ui_without_a_comparison_says_so(smoke_config, capsys):
    assert cli_main(["ui", "--config", SMOKE, "--print-only"]) == 0
    assert "no comparison yet (`make compare`)" in capsys.readouterr().out


def test_ui_on_a_port_in_use_is_one_line_naming_the_variable(smoke_config, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["ui", "--config", SMOKE, "--port", str(port)]) != 0
    err = capsys.readouterr().err
    assert f"error: port {port} on 127.0.0.1 is in use" in err and "UI_PORT=" in err
    assert "Traceback" not in err


def test_serve_on_a_port_in_use_is_one_line_naming_the_variable(smoke_config, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["serve", "--config", SMOKE, "--port", str(port), "--model", "runs:/0/model"]) != 0
    err = capsys.readouterr().err
    assert f"error: port {port} on 127.0.0.1 is in use" in err and "SERVE_PORT=" in err


def on_genai_overview(text: str) -> bool:
    return any(marker in text for marker in GENAI_OVERVIEW_MARKERS)


def test_browser_opens_on_the_runs_table_with_the_comparison(comparison, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    config, _ = comparison
    found = ui.latest_comparison(config.tracking)
    client = mlflow.tracking.MlflowClient()
    children = [client.get_run(run_id) for run_id in found.child_ids]
    with ui.mlflow_server(config.tracking.tracking_uri) as base:
        pages = ui_screenshots.capture(base, found, tmp_path / "screens")
        # control: the experiment page without the link's parameter is the GenAI overview in this MLflow,
        # so the checks below would catch a link that lands there
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=ui_screenshots.browser_path(), args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"{base}/#/experiments/{found.experiment_id}")
            try:  # until the overview has drawn (a page that never shows it fails below, after 30 s)
                page.wait_for_function(
                    "markers => markers.some(m => document.body.innerText.includes(m))",
                    arg=list(GENAI_OVERVIEW_MARKERS),
                    timeout=30_000,
                )
            except PlaywrightTimeout:
                pass
            bare = page.inner_text("body")
            browser.close()
    assert on_genai_overview(bare), bare[:500]

    table = pages["runs_table"]
    assert "/runs" in table.url and "/overview" not in table.url
    assert not on_genai_overview(table.text)
    for name in ("model.pooling", "model.init", "test_accuracy", found.parent_name, "baseline-nbsvm"):
        assert name in table.text
    for child in children:  # the parent is expanded: every child's name and its pooling are on screen
        assert child.info.run_name in table.text
    accuracy = f"{children[0].data.metrics['test_accuracy']}"[:6]
    assert accuracy in table.text

    parent = pages["comparison_run"]
    assert "Verdict." in parent.text and "first_token" in parent.text and "Child runs" in parent.text

    side_by_side = pages["compare_children"]
    assert "Comparing 2 Runs" in side_by_side.text
    assert children[0].info.run_name in side_by_side.text and children[1].info.run_name in side_by_side.text
    # parameters: only the differences (the seed); metrics: a virtualised table, its first rows are on screen
    assert "training.seed" in side_by_side.text and "model.hidden_dim" not in side_by_side.text
    assert "Metrics" in side_by_side.text and "behaviour_negation" in side_by_side.text
    for page in pages.values():
        assert page.screenshot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_capture_needs_a_comparison():
    with pytest.raises(ui.PipelineError, match="run `make compare` first"):
        ui_screenshots.capture("http://127.0.0.1:9", ui.Comparison("1", None, None, ()), None)


def test_servers_started_in_another_folder_get_an_absolute_store(tmp_path, monkeypatch):
    """`make ui` / `make serve` with the default relative store: the server process runs elsewhere."""
    from pipeline.stages.serve.command import serve_environment
    from pipeline.tracking import absolute_tracking_uri

    monkeypatch.chdir(tmp_path)
    assert absolute_tracking_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert absolute_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert absolute_tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    assert f"sqlite:///{tmp_path / 'mlflow.db'}" in ui.server_command("sqlite:///mlflow.db", 5000)
    assert (
        serve_environment("sqlite:///mlflow.db", "models:/m@champion")["MLFLOW_TRACKING_URI"]
        == f"sqlite:///{tmp_path / 'mlflow.db'}"
    )
