"""Figures from one source: run-derived figures in the README and docs/ are rendered from committed snapshots.

A snapshot (``docs/figures/<name>.json``) is what one finished build left: its comparison's figures, read from the
build's ``comparison.json``, and the build's wall time and peak memory, read from ``/usr/bin/time -v``'s report,
with the machine, its default training step time, the date and the commit. Pages hold marked blocks::

    <!-- figures: default.answer -->
    ...rendered text...
    <!-- /figures -->

``python tools/figures.py render`` rewrites every block from its snapshot; ``tests/test_docs.py`` rerenders them and
fails when a page and its snapshot disagree.

    /usr/bin/time -v make all 2> make_all.time
    python tools/figures.py snapshot reports/comparison.json --name default --time-log make_all.time \\
        --step-ms 153 --machine "2-core AMD EPYC (AVX-512)"
    python tools/figures.py render
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "docs" / "figures"
BLOCK = re.compile(r"(<!-- figures: (\w+)\.(\w+) -->\n)(.*?)(<!-- /figures -->)", re.DOTALL)
NAMES = {  # a candidate's row in the answer table
    "first_token": "Transformer `first_token`",
    "mean": "Transformer `mean`",
    "nbsvm": "**NBSVM** (1-3-gram naive-Bayes logistic regression)",
    "tfidf": "TF-IDF + logistic regression (reference)",
}


# --------------------------------------------------------------------------- snapshots


def time_report(path: Path) -> dict[str, float]:
    """Wall seconds and peak resident memory (GB) from ``/usr/bin/time -v``'s report."""
    text = path.read_text()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if not wall or not peak:
        raise SystemExit(f"error: {path}: no /usr/bin/time -v report (wall clock and maximum resident set size)")
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return {"build_seconds": round(seconds), "peak_gb": round(int(peak.group(1)) / 1e6, 1)}


def cascade_share(reports: Path) -> float | None:
    """The share of reviews a cascaded fusion's Transformer reads, from its ``fusion.json`` in the comparison's
    reports folder (None: no cascade, or fusions that differ)."""
    shares = {
        json.loads(path.read_text()).get("cascade_share") for path in sorted(reports.glob("fusion-*/fusion.json"))
    }
    return shares.pop() if len(shares) == 1 else None


def summary_figures(comparison: dict) -> dict:
    """What the pages quote of a comparison: each candidate's mean test accuracy (and its spread over seeds), mean
    validation accuracy and test crops' accuracy, the pooling difference and the deployed candidate."""
    candidates = {}
    for name, row in comparison["summary"].items():
        test = row["test_accuracy"]
        candidates[name] = {
            "test": round(test["mean"], 4),
            "test_std": round(test.get("std") or 0.0, 4),
            "seeds": len(test.get("values") or []),
            "val": round(row["selection_val_accuracy"]["mean"], 4) if row.get("selection_val_accuracy") else None,
            "test_crops": round(row["test_crop_accuracy"]["mean"], 4) if row.get("test_crop_accuracy") else None,
            "val_crops": round(row["val_crop_accuracy"]["mean"], 4) if row.get("val_crop_accuracy") else None,
        }
    difference = comparison.get("difference") or {}
    bootstrap = difference.get("bootstrap") or {}
    interval = [bootstrap.get("ci_low"), bootstrap.get("ci_high")]
    recommendation = comparison["recommendation"]
    return {
        "candidates": candidates,
        "test_rows": comparison["test_rows"],
        "pooling": {
            "points": round(100 * difference["mean_accuracy_difference"], 2) if difference else None,
            "ci_points": [round(100 * bound, 2) if bound is not None else None for bound in interval],
            "significant": difference.get("significant"),
        },
        "deployed": {
            "variant": recommendation["variant"],
            "test": round(recommendation["test_accuracy"], 4),
            "val": round(recommendation["selection_val_accuracy"], 4),
            "test_crops": round(recommendation["test_crop_accuracy"], 4),
        },
    }


def snapshot(args: argparse.Namespace) -> Path:
    comparison = json.loads(Path(args.comparison).read_text())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=Path(args.comparison).parent, capture_output=True, text=True
    ).stdout.strip()
    figures = {
        "machine": args.machine,
        "step_ms": args.step_ms,
        "step_of": args.step_of,
        "build_of": args.build_of,
        "date": args.date,
        "commit": commit or None,
        **(time_report(Path(args.time_log)) if args.time_log else {}),
        **summary_figures(comparison),
    }
    share = cascade_share(Path(args.comparison).parent)
    if share is not None and "+" in figures["deployed"]["variant"]:
        figures["cascade"] = {"share": share}
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    path = SNAPSHOTS / f"{args.name}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------- blocks


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes"


def answer(figures: dict) -> str:
    """The README's answer: the candidates' table, the pooling verdict and the deployed model."""
    rows = ["| candidate | test accuracy | validation (what chooses) | test crops |", "| --- | --- | --- | --- |"]
    candidates = figures["candidates"]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    for name, row in candidates.items():
        if "+" in name:
            continue
        spread = f" ± {row['test_std']:.4f}" if row["seeds"] > 1 else ""
        rows.append(
            f"| {NAMES.get(name, name)} | {row['test']:.4f}{spread} | {cell(row['val'])} | {cell(row['test_crops'])} |"
        )
        if name == "nbsvm":
            fused = [candidates[n] for n in candidates if "+" in n]
            if fused:
                join = " / ".join
                rows.append(
                    "| NBSVM fused with "
                    + join(f"`{n.split('+', 1)[1]}`" for n in candidates if "+" in n)
                    + f" | {join(cell(r['test']) for r in fused)} | {join(cell(r['val']) for r in fused)} | "
                    f"{join(cell(r['test_crops']) for r in fused)} |"
                )
    pooling, deployed = figures["pooling"], figures["deployed"]
    low, high = pooling["ci_points"]
    verdict = "significant" if pooling["significant"] else "not significant"
    return "\n".join(
        [
            *rows,
            "",
            f"- **Pooling**: first_token minus mean {pooling['points']:+.2f} points "
            f"(95 % CI {low:+.2f} to {high:+.2f}), **{verdict}**.",
            f"- **Deployed**: `{deployed['variant']}`, chosen on validation ({deployed['val']:.4f}); test "
            f"{deployed['test']:.4f}, test crops {deployed['test_crops']:.4f}.",
            f"- **Built** in {minutes(figures['build_seconds'])} wall, peak {figures['peak_gb']:.1f} GB, on a "
            f"{figures['machine']} whose default training step took {figures['step_ms']} ms ({figures['date']}).",
            "",
        ]
    )


def results(figures: dict) -> str:
    """docs/results.md's table: every candidate with its validation crops too, then how the build ran."""
    rows = [
        "| candidate | test accuracy | val accuracy (chosen by) | val crops | test crops |",
        "| --- | --- | --- | --- | --- |",
    ]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    for name, row in figures["candidates"].items():
        spread = f" ± {row['test_std']:.4f}" if row["seeds"] > 1 else ""
        label = NAMES.get(name, name.replace("nbsvm+", "NBSVM + `") + "`" if "+" in name else name)
        rows.append(
            f"| {label} | {row['test']:.4f}{spread} | {cell(row['val'])} | {cell(row['val_crops'])} | "
            f"{cell(row['test_crops'])} |"
        )
    deployed = figures["deployed"]
    return "\n".join(
        [
            *rows,
            "",
            f"- **Deployed: `{deployed['variant']}`**, chosen on validation: test {deployed['test']:.4f}, test crops "
            f"{deployed['test_crops']:.4f}; {figures['test_rows']:,} test reviews.",
            f"- `make all` on a fresh clone, `.venv/` included: {minutes(figures['build_seconds'])} wall, peak "
            f"{figures['peak_gb']:.1f} GB, a {figures['machine']} whose default training step took "
            f"{figures['step_ms']} ms ({figures['date']}; `docs/figures/default.json` records the commit).",
            "",
        ]
    )


def short(figures: dict) -> str:
    """The README's line on a second config's build (the short-texts one): what it deploys, its test figures, its
    cascade's share when it is one, and what building it took."""
    deployed = figures["deployed"]
    cascade = figures.get("cascade")
    read = f", a cascade: MiniLM reads the {cascade['share']:.0%} of reviews NBSVM is least sure of" if cascade else ""
    return (
        f"  Deployed: `{deployed['variant']}`{read}; **test {deployed['test']:.4f}, test crops "
        f"{deployed['test_crops']:.4f}**. `make all` took {minutes(figures['build_seconds'])} wall "
        f"{figures.get('build_of', 'on a fresh clone')}, peak {figures['peak_gb']:.1f} GB, on a {figures['machine']} "
        f"whose {figures.get('step_of', 'default training step')} took {figures['step_ms']:,} ms ({figures['date']}).\n"
    )


RENDERERS: dict[str, Callable[[dict], str]] = {"answer": answer, "results": results, "short": short}


def render_text(text: str, snapshots: Path = SNAPSHOTS) -> str:
    """``text`` with every marked block rendered from its snapshot."""

    def one(match: re.Match) -> str:
        name, block = match.group(2), match.group(3)
        path = snapshots / f"{name}.json"
        if not path.is_file() or block not in RENDERERS:
            raise SystemExit(f"error: figures block {name}.{block}: no snapshot {path} or no renderer {block!r}")
        return match.group(1) + RENDERERS[block](json.loads(path.read_text())) + match.group(5)

    return BLOCK.sub(one, text)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "history" not in p.parts)]


def render(_: argparse.Namespace) -> list[Path]:
    changed = []
    for page in pages():
        text = page.read_text()
        rendered = render_text(text)
        if rendered != text:
            page.write_text(rendered)
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    take = commands.add_parser("snapshot", help="write docs/figures/<name>.json from a build's comparison.json")
    take.add_argument("comparison", help="the build's reports/comparison.json")
    take.add_argument("--name", required=True, help="the snapshot's name (default, short_texts)")
    take.add_argument("--time-log", help="the build's /usr/bin/time -v report")
    take.add_argument("--step-ms", type=int, required=True, help="a training step's time that day (ms)")
    take.add_argument("--step-of", default="default training step", help="which step --step-ms measured")
    take.add_argument("--build-of", default="on a fresh clone", help="what the timed build included")
    take.add_argument("--machine", required=True, help="the machine, in words")
    take.add_argument("--date", required=True, help="the build's date (YYYY-MM-DD)")
    commands.add_parser("render", help="rewrite every marked block of the README and docs/ from its snapshot")
    args = parser.parse_args(argv)
    if args.command == "snapshot":
        print(f"figures: wrote {snapshot(args).relative_to(ROOT)}")
    else:
        changed = render(args)
        print(f"figures: rendered {len(changed)} page(s)" + "".join(f"\n  {p.relative_to(ROOT)}" for p in changed))


if __name__ == "__main__":
    sys.exit(main())
