"""The MLflow UI: links that open on the comparison, a local server, and screenshots of what a person sees.

Stages:
- ``ui`` (``make ui``): prints the links to the experiment's runs table and to the latest comparison's
  parent run, then runs ``mlflow server`` on the tracking store in the foreground.
- ``ui-screenshots`` (``make ui-screenshots``): starts a server on a free port, opens the pages in
  Debian's chromium through Playwright and writes ``reports/ui/*.png``.

MLflow 3.17's UI has a GenAI / model-training switch. An experiment page opened without the
``workflowType`` URL parameter follows the browser's last choice, GenAI by default (a traces
overview with "No data available"), whatever the experiment's ``mlflow.experimentKind`` tag says;
every link printed here therefore carries ``workflowType=machine_learning``.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config
from pipeline.errors import PipelineError
from pipeline.servers import free_port, local_server

WORKFLOW_QUERY = "workflowType=machine_learning"  # the model-training side of the UI, not GenAI
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
GENAI_OVERVIEW_MARKERS = ("No data available for the selected time range", "Detect Issues")


# --------------------------------------------------------------------------- links


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKFLOW_QUERY}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_QUERY}"


def compare_url(base: str, experiment_id: str, run_ids: list[str]) -> str:
    query = urllib.parse.urlencode({"runs": json.dumps(run_ids), "experiments": json.dumps([experiment_id])})
    return f"{base}/#/compare-runs?{query}&{WORKFLOW_QUERY}"


@dataclass(frozen=True)
class Comparison:
    """What the UI pages show: the experiment, the latest comparison's parent run and its model runs."""

    experiment_id: str
    parent_id: str | None
    parent_name: str | None
    child_ids: tuple[str, ...]


def latest_comparison(config: Config) -> Comparison:
    """The experiment and its latest pooling comparison (``parent_id`` None when there is none yet)."""
    from pipeline.tracking import comparison_members, latest_champion_comparison, setup_tracking

    experiment_id = setup_tracking(config)
    try:
        parent = latest_champion_comparison(config)
        children = comparison_members(parent)
    except PipelineError:
        return Comparison(experiment_id, None, None, ())
    return Comparison(experiment_id, parent.info.run_id, parent.info.run_name,
                      tuple(child.info.run_id for child in children))


# --------------------------------------------------------------------------- server and browser


def server_command(tracking_uri: str, port: int) -> list[str]:
    from pipeline.tracking import absolute_tracking_uri

    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", absolute_tracking_uri(tracking_uri),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]


def mlflow_server(tracking_uri: str, port: int | None = None, timeout: float = 120.0):
    """``mlflow server`` on 127.0.0.1 for the duration of a ``with`` block; yields its base URL."""
    port = port or free_port()
    return local_server(server_command(tracking_uri, port), port, "/health", "mlflow server", timeout=timeout)


def browser_path() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    raise PipelineError("no chromium found: run `make setup-browser` (apt-get install chromium)")


@dataclass
class Page:
    name: str
    url: str       # where the browser ended up
    text: str      # what the page says (its visible text)
    screenshot: Path


SETTLE_MS = 2000  # after the awaited text shows: let the tables and charts finish drawing


RUN_TABLE_COLUMNS = ("model.pooling", "model.init", "test_accuracy")  # added to the runs table's default columns


def capture(base: str, comparison: Comparison, out_dir: Path, timeout_ms: int = 60_000) -> dict[str, Page]:
    """Open the runs table, the comparison's parent run and the side-by-side view of two children.

    What a person would do: close the assistant panel, expand the comparison's parent row, add the
    pooling, init and test accuracy columns, open the parent run (its description expanded), then
    compare two children (parameters: differences only). Screenshots go to ``out_dir/<page>.png``.
    """
    from playwright.sync_api import sync_playwright

    if comparison.parent_id is None or len(comparison.child_ids) < 2:
        raise PipelineError("no comparison with two or more model runs to show: run `make compare` first")
    out_dir.mkdir(parents=True, exist_ok=True)
    pages: dict[str, Page] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(timeout_ms)

            def keep(name: str) -> None:
                page.wait_for_timeout(SETTLE_MS)  # the UI keeps polling, so "network idle" never comes
                path = out_dir / f"{name}.png"
                page.screenshot(path=str(path))
                pages[name] = Page(name, page.url, page.inner_text("body"), path)

            page.goto(experiment_url(base, comparison.experiment_id))
            parent_row = page.get_by_role("row").filter(has_text=comparison.parent_name).first
            parent_row.wait_for()
            close = page.get_by_role("button", name="Close", exact=True)
            if close.count():
                close.first.click()  # the assistant panel
            parent_row.locator("button").first.click()  # expand: the children show under it
            page.get_by_role("button", name="Columns", exact=True).click()
            search = page.get_by_placeholder("Search columns")
            for column in RUN_TABLE_COLUMNS:
                search.fill(column)
                exact = re.compile(f"^{re.escape(column)}$")  # not test_accuracy_len_...
                page.locator(".du-bois-light-tree-title").filter(has_text=exact).first.click()
            page.keyboard.press("Escape")
            keep("runs_table")

            page.goto(run_url(base, comparison.experiment_id, comparison.parent_id))
            page.get_by_text("Description", exact=True).first.wait_for()
            more = page.get_by_text("Show more", exact=True)
            if more.count():
                more.first.click()
            keep("comparison_run")

            page.goto(compare_url(base, comparison.experiment_id, list(comparison.child_ids[:2])))
            page.get_by_text("Run details", exact=True).first.wait_for()  # then params: differences only
            diff_only = page.get_by_text("Show diff only", exact=True)
            if diff_only.count():
                diff_only.first.click()
            keep("compare_children")
        finally:
            browser.close()
    return pages


# --------------------------------------------------------------------------- stage entry points


def main(config: Config, args) -> None:
    """``make ui``: print where to look, then serve the UI until Ctrl-C."""
    from pipeline.tracking import tracking_uri

    comparison = latest_comparison(config)
    base = f"http://127.0.0.1:{args.port}"
    print(f"ui: MLflow UI for {tracking_uri(config)} at {base} (Ctrl-C to stop)")
    print(f"ui: runs table  {experiment_url(base, comparison.experiment_id)}")
    if comparison.parent_id:
        print(f"ui: latest comparison ({comparison.parent_name}, {len(comparison.child_ids)} model runs)  "
              f"{run_url(base, comparison.experiment_id, comparison.parent_id)}")
    else:
        print("ui: no comparison yet (`make compare`)")
    sys.stdout.flush()
    if args.print_only:
        return
    with contextlib.suppress(KeyboardInterrupt):
        subprocess.run(server_command(tracking_uri(config), args.port), check=False)


def screenshots_main(config: Config, args) -> None:
    """``make ui-screenshots``: the UI pages of the latest comparison as PNGs in ``reports/ui/``."""
    from pipeline.tracking import tracking_uri

    started = time.perf_counter()
    comparison = latest_comparison(config)
    out_dir = Path(args.output) if args.output else config.reports_dir / "ui"
    with mlflow_server(tracking_uri(config)) as base:
        pages = capture(base, comparison, out_dir)
    print(f"ui-screenshots: read comparison {comparison.parent_id} ({len(comparison.child_ids)} model runs) from "
          f"{tracking_uri(config)}; wrote {', '.join(p.screenshot.name for p in pages.values())} to {out_dir}/ in "
          f"{time.perf_counter() - started:.0f}s")
