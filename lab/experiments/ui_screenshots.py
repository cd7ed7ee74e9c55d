"""``make ui-screenshots``: the MLflow UI pages of the latest comparison as a person sees them.

Reads:  the tracking store; Debian's chromium (``make setup-browser``), driven by Playwright.
Writes: ``reports/ui/{runs_table,comparison_run,compare_children}.png``.

It starts ``mlflow server`` on a free port, opens the runs table, the comparison's parent run and
two children side by side, and screenshots each page.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Config
from pipeline.core.errors import PipelineError
from pipeline.stages.ui.links import Comparison, compare_url, experiment_url, latest_comparison, mlflow_server, run_url
from pipeline.tracking import tracking_uri

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser_path() -> str:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    raise PipelineError("no chromium found: run `make setup-browser` (apt-get install chromium)")


@dataclass
class Page:
    name: str
    url: str  # where the browser ended up
    text: str  # what the page says (its visible text)
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


# --------------------------------------------------------------------------- stage entry point


def main(config: Config, args) -> None:
    """``make ui-screenshots``: the UI pages of the latest comparison as PNGs in ``reports/ui/``."""
    started = time.perf_counter()
    comparison = latest_comparison(config.tracking)
    out_dir = Path(args.output) if args.output else config.reports_dir / "ui"
    uri = tracking_uri(config.tracking)
    with mlflow_server(uri) as base:
        pages = capture(base, comparison, out_dir)
    print(
        f"ui-screenshots: read comparison {comparison.parent_id} ({len(comparison.child_ids)} model runs) from "
        f"{uri}; wrote {', '.join(p.screenshot.name for p in pages.values())} to {out_dir}/ in "
        f"{time.perf_counter() - started:.0f}s"
    )
