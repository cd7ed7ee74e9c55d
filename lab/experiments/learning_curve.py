"""``make learning-curve``: test accuracy against the number of labelled training reviews, for every candidate.

Reads:  ``data/ingest/`` and ``data/tokenize/`` (the configured tokenization: the pipeline's own, or a
        ``model.preset``'s; and whatever the train and evaluate stages read).
Writes: ``reports/learning_curve.{json,md,png}`` and an MLflow run holding them; an MLflow run per Transformer.

At each size ``n`` of ``--sizes`` (``all``: every train row) and each seed of ``--seeds`` (default
``compare.seeds``), the same ``n`` train rows (the rows ``train_model`` reports it kept, seeded) train:

- the configured encoder with each pooling (``first_token``, ``mean``): ``training.max_train_samples=n``, without
  distillation (a teacher fitted on every label would leak them), evaluated on the whole validation and test splits;
- NBSVM (its C chosen on validation), on the same rows;
- their fusion per pooling (the Transformer's weight chosen on validation).

Per size the report gives each candidate's mean test accuracy with a bootstrap interval (test rows resampled, seeds
averaged), and three paired comparisons by the comparison's protocol (``pipeline.metrics.compare_pair``): first
token against mean, the better pooling on validation against NBSVM, its fusion against NBSVM. What to deploy at a
size is the candidate with the best mean validation accuracy, never test. A run with another encoder (a
``model.preset`` config with its own data folder over the same ingested reviews) adds its part to the same report,
and the choice per size is then made over every encoder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.experiments import DEFAULT_SIZES, parse_seeds
from pipeline.config import POOLINGS, Config, ModelConfig
from pipeline.core.catalog import require_output
from pipeline.core.errors import ConfigError, InputError, PipelineError
from pipeline.core.files import atomic_write_json, atomic_write_text
from pipeline.core.predictions import from_probability_columns, fuse_probabilities
from pipeline.lexical import CropRows, class_probabilities, nbsvm_baseline
from pipeline.metrics import best_fusion_weight, compare_pair, paired_bootstrap_difference
from pipeline.stages.evaluate.scorecard import evaluate_run
from pipeline.stages.tokenize.outputs import IngestedRows, read_ingested_rows
from pipeline.stages.train.fit_and_log import train_model

REPORT_NAME = "learning_curve"
NBSVM = "nbsvm"


@dataclass(frozen=True)
class Scored:
    """One candidate at one size and seed: its validation accuracy and per-row correctness on test."""

    candidate: str
    size: int
    seed: int
    val_accuracy: float
    test_correct: np.ndarray
    run_id: str | None = None


def encoder_name(model: ModelConfig) -> str:
    """The encoder a curve is of: a preset's folder or name, or the pipeline's own encoder's shape."""
    if model.preset is not None:
        return f"preset {Path(model.preset).name or model.preset}"
    blocks = f"{model.num_layers} block" + ("s" if model.num_layers != 1 else "")
    return f"own encoder (width {model.hidden_dim}, {blocks}, n-grams to {model.ngram_max})"


def accuracy(labels: np.ndarray, probabilities: np.ndarray) -> float:
    return float((probabilities.argmax(axis=1) == labels).mean())


def lexical_and_fused(
    frames: IngestedRows,
    keep: np.ndarray,
    config: Config,
    size: int,
    seed: int,
    transformers: dict[str, tuple[np.ndarray, np.ndarray]],
) -> list[Scored]:
    """NBSVM on the ``keep`` train rows, and its fusion with each pooling's ``(val, test)`` probabilities."""
    val, test, names = frames.val, frames.test, frames.labels
    settings = config.nbsvm
    fitted = nbsvm_baseline(
        frames.train.iloc[keep],
        val,
        settings.c_values,
        settings.ngram_max,
        settings.max_features,
        settings.seed,
        CropRows(settings.crops_per_review, settings.crop_label_weight),
    ).model  # labelled rows only
    val_l = class_probabilities(fitted, val["text"].tolist(), len(names))
    test_l = class_probabilities(fitted, test["text"].tolist(), len(names))
    y_val, y_test = val["label"].to_numpy(), test["label"].to_numpy()
    scored = [Scored(NBSVM, size, seed, accuracy(y_val, val_l), test_l.argmax(axis=1) == y_test)]
    for pooling, (val_t, test_t) in transformers.items():
        weight, _, honest = best_fusion_weight(val_t, val_l, y_val, config.compare.fusion_weights)
        fused = fuse_probabilities(test_t, test_l, weight)
        scored.append(Scored(f"{NBSVM}+{pooling}", size, seed, honest, fused.argmax(axis=1) == y_test))
    return scored


def transformer(
    config: Config, frames: IngestedRows, size: int, seed: int, pooling: str
) -> tuple[Scored, np.ndarray, np.ndarray, np.ndarray]:
    """The configured encoder with ``pooling`` trained on ``size`` train rows and evaluated: its score, its
    validation and test probabilities, and the train rows it learned from."""
    child = config.replace(
        model={"pooling": pooling}, training={"max_train_samples": size, "seed": seed, "pseudo_labels": False}
    )
    trained = train_model(child)
    evaluated = evaluate_run(child, run=trained.logged_run_id())
    names = frames.labels
    val_p = from_probability_columns(evaluated.predictions("val"), names)
    test_p = from_probability_columns(evaluated.predictions("test"), names)
    y_val, y_test = frames.val["label"].to_numpy(), frames.test["label"].to_numpy()
    scored = Scored(pooling, size, seed, accuracy(y_val, val_p), test_p.argmax(axis=1) == y_test, trained.run_id)
    return scored, val_p, test_p, trained.train_rows


def sizes_of(text: str, train_rows: int) -> list[int]:
    """``--sizes``: comma-separated row counts and ``all``; sizes at or above the train split mean all of it."""
    sizes = set()
    for item in (part.strip() for part in text.split(",") if part.strip()):
        if item == "all":
            sizes.add(train_rows)
            continue
        try:
            value = int(item)
        except ValueError:
            raise ConfigError(f"--sizes: {item!r} is neither a number of rows nor 'all'") from None
        if value < 2:
            raise ConfigError(f"--sizes: {value} rows cannot train a classifier (at least 2)")
        sizes.add(min(value, train_rows))
    if not sizes:
        raise ConfigError("--sizes names no size")
    return sorted(sizes)


def summarize(scores: list[Scored], samples: int) -> list[dict]:
    """Per size and candidate: seeds, mean validation and test accuracy, and the test interval (bootstrap over
    test rows of the seed-averaged correctness)."""
    rows = []
    for size in sorted({s.size for s in scores}):
        for candidate in dict.fromkeys(s.candidate for s in scores if s.size == size):
            mine = sorted((s for s in scores if s.size == size and s.candidate == candidate), key=lambda s: s.seed)
            correct = np.stack([s.test_correct for s in mine])
            interval = paired_bootstrap_difference(correct, np.zeros_like(correct), samples=samples)
            rows.append(
                {
                    "size": size,
                    "candidate": candidate,
                    "seeds": [s.seed for s in mine],
                    "mean_val_accuracy": float(np.mean([s.val_accuracy for s in mine])),
                    "mean_test_accuracy": float(correct.mean()),
                    "ci_low": interval["ci_low"],
                    "ci_high": interval["ci_high"],
                    "run_ids": [s.run_id for s in mine if s.run_id],
                }
            )
    return rows


def pairs_at(scores: list[Scored], size: int, samples: int) -> dict[str, dict]:
    """The paired comparisons at ``size``: first token against mean; the better pooling on validation against
    NBSVM; its fusion against NBSVM."""

    def correct(candidate: str) -> tuple[np.ndarray, list[dict]]:
        mine = sorted((s for s in scores if s.size == size and s.candidate == candidate), key=lambda s: s.seed)
        return np.stack([s.test_correct for s in mine]), [{"seed": s.seed} for s in mine]

    def mean_val(candidate: str) -> float:
        return float(np.mean([s.val_accuracy for s in scores if s.size == size and s.candidate == candidate]))

    better = max(POOLINGS, key=mean_val)
    questions = {
        "first_token - mean": ("first_token", "mean"),
        f"{better} - {NBSVM}": (better, NBSVM),
        f"{NBSVM}+{better} - {NBSVM}": (f"{NBSVM}+{better}", NBSVM),
    }
    found = {}
    for name, (a, b) in questions.items():
        (correct_a, labels), (correct_b, _) = correct(a), correct(b)
        found[name] = compare_pair(correct_a, correct_b, labels, samples)
    return found


def deploy_at(summary: list[dict]) -> dict[int, str]:
    """Per size, the candidate with the best mean validation accuracy (what a user with that many labels deploys)."""
    best: dict[int, dict] = {}
    for row in summary:
        if row["size"] not in best or row["mean_val_accuracy"] > best[row["size"]]["mean_val_accuracy"]:
            best[row["size"]] = row
    return {size: row["candidate"] for size, row in best.items()}


def plot_curve(encoders: dict[str, dict], path: Path) -> Path:
    """Mean test accuracy against labelled rows (log scale): a line per candidate of every encoder (NBSVM once), its
    interval as a band."""
    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure(8.5, 5.2)
    lines: dict[str, list[dict]] = {}
    for encoder, part in encoders.items():
        for candidate in dict.fromkeys(row["candidate"] for row in part["summary"]):
            label = candidate if candidate == NBSVM else f"{candidate}: {encoder}"
            lines.setdefault(label, [row for row in part["summary"] if row["candidate"] == candidate])
    for index, (label, rows) in enumerate(lines.items()):
        sizes = [row["size"] for row in rows]
        axis.plot(
            sizes,
            [row["mean_test_accuracy"] for row in rows],
            marker="o",
            color=f"C{index % 10}",
            linestyle="-" if index < 10 else "--",
            label=label,
        )
        axis.fill_between(
            sizes, [row["ci_low"] for row in rows], [row["ci_high"] for row in rows], color=f"C{index % 10}", alpha=0.12
        )
    axis.set_xscale("log")
    axis.set(
        xlabel="labelled training reviews",
        ylabel="test accuracy",
        title="Test accuracy against labelled rows (bands: 95 % bootstrap over test rows)",
    )
    axis.title.set_fontsize(9)
    axis.legend(fontsize=6)
    return save_figure(figure, path)


def deploy_overall(encoders: dict[str, dict]) -> dict[str, str]:
    """Per size, over every encoder: the candidate with the best mean validation accuracy."""
    best: dict[int, tuple[float, str]] = {}
    for encoder, part in encoders.items():
        for row in part["summary"]:
            name = row["candidate"] if row["candidate"] == NBSVM else f"{row['candidate']} ({encoder})"
            if row["size"] not in best or row["mean_val_accuracy"] > best[row["size"]][0]:
                best[row["size"]] = (row["mean_val_accuracy"], name)
    return {str(size): name for size, (_, name) in sorted(best.items())}


def render_markdown(report: dict) -> str:
    lines = [
        "# Test accuracy against labelled reviews",
        "",
        "Every candidate at a size and seed trains on the same rows and is scored on the same validation and test "
        "reviews. What to deploy is chosen on validation; intervals are 95 % bootstraps over test rows.",
        "",
        "| labelled rows | deploy (best on validation, every encoder) |",
        "| --- | --- |",
    ]
    lines += [f"| {int(size):,} | {name} |" for size, name in report["deploy"].items()]
    for encoder, part in report["encoders"].items():
        lines += [
            "",
            f"## {encoder}",
            "",
            f"Seeds {part['seeds']}; {part['val_rows']:,} validation and {part['test_rows']:,} test reviews.",
            "",
            "| labelled rows | candidate | mean validation accuracy | mean test accuracy | 95 % interval |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {row['size']:,} | {row['candidate']} | {row['mean_val_accuracy']:.4f} | "
            f"{row['mean_test_accuracy']:.4f} | {row['ci_low']:.4f} to {row['ci_high']:.4f} |"
            for row in part["summary"]
        ]
        lines += [
            "",
            "| labelled rows | deploy (this encoder) | comparison | test difference | 95 % CI | significant |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for size, pairs in part["pairs"].items():
            for name, pair in pairs.items():
                boot = pair["bootstrap"]
                lines.append(
                    f"| {int(size):,} | {part['deploy'][size]} | {name} | "
                    f"{100 * pair['mean_accuracy_difference']:+.2f} points | {100 * boot['ci_low']:+.2f} to "
                    f"{100 * boot['ci_high']:+.2f} | {'yes' if pair['significant'] else 'no'} |"
                )
    return "\n".join(lines) + "\n"


def merged(previous_path: Path, ingest_sha256: str, encoder: str, part: dict) -> dict:
    """This encoder's part with the other encoders' parts of an earlier report over the same ingested reviews."""
    encoders = {}
    if previous_path.is_file():
        try:
            previous = json.loads(previous_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise InputError(f"{previous_path}: not a readable learning-curve report ({error}); move it away") from None
        if isinstance(previous, dict) and previous.get("ingest_manifest_sha256") == ingest_sha256:
            encoders = {name: other for name, other in previous.get("encoders", {}).items() if name != encoder}
    encoders[encoder] = part
    return {"ingest_manifest_sha256": ingest_sha256, "encoders": encoders, "deploy": deploy_overall(encoders)}


def run(config: Config, sizes: str = DEFAULT_SIZES, seeds: tuple[int, ...] | None = None) -> Path:
    """The curve of the configured encoder over ``sizes`` and ``seeds``; returns the Markdown report."""
    started = time.perf_counter()
    frames = read_ingested_rows(require_output(config, "ingest"), require_output(config, "tokenize"))
    seeds = tuple(config.compare.seeds) if seeds is None else seeds
    scores: list[Scored] = []
    for size in sizes_of(sizes, len(frames.train)):
        for seed in seeds:
            transformers, kept = {}, []
            for pooling in POOLINGS:
                scored, val_p, test_p, rows = transformer(config, frames, size, seed, pooling)
                scores.append(scored)
                transformers[pooling] = (val_p, test_p)
                kept.append(rows)
            if any(not np.array_equal(kept[0], rows) for rows in kept):
                raise PipelineError(f"learning-curve: the poolings at {size} rows, seed {seed} learned from other rows")
            scores += lexical_and_fused(frames, kept[0], config, size, seed, transformers)  # the rows training kept
    return write_report(config, frames, scores, seeds, started)


def write_report(
    config: Config, frames: IngestedRows, scores: list[Scored], seeds: tuple[int, ...], started: float
) -> Path:
    """The JSON, Markdown and plot in ``reports/``, and an MLflow run that holds them with a metric per point."""
    import mlflow

    from pipeline.tracking import STAGE_TAG, setup_tracking

    samples = config.compare.bootstrap_samples
    summary = summarize(scores, samples)
    sizes = sorted({s.size for s in scores})
    encoder = encoder_name(config.model)
    part = {
        "seeds": list(seeds),
        "val_rows": len(frames.val),
        "test_rows": len(frames.test),
        "summary": summary,
        "pairs": {str(size): pairs_at(scores, size, samples) for size in sizes},
        "deploy": {str(size): name for size, name in deploy_at(summary).items()},
    }
    reports = config.reports_dir
    report = merged(reports / f"{REPORT_NAME}.json", frames.ingest_manifest_sha256, encoder, part)
    json_path = atomic_write_json(reports / f"{REPORT_NAME}.json", report)
    md_path = atomic_write_text(reports / f"{REPORT_NAME}.md", render_markdown(report))
    png_path = plot_curve(report["encoders"], reports / f"{REPORT_NAME}.png")
    setup_tracking(config.tracking)
    with mlflow.start_run(run_name=f"learning-curve {encoder}"):
        mlflow.set_tags({STAGE_TAG: REPORT_NAME, "encoder": encoder})
        mlflow.log_params({"sizes": ",".join(map(str, sizes)), "seeds": ",".join(map(str, seeds))})
        for row in summary:
            name = row["candidate"].replace("+", "-")  # MLflow names allow no "+"
            mlflow.log_metric(f"test_accuracy.{name}", row["mean_test_accuracy"], step=row["size"])
        for path in (json_path, md_path, png_path):
            mlflow.log_artifact(str(path), REPORT_NAME)
    print(
        f"learning-curve: {encoder}: {len(scores)} candidates scored at {len(sizes)} sizes x {len(seeds)} seeds "
        f"on {len(frames.test):,} test reviews; deploy {part['deploy']}; wrote {md_path}, {json_path.name}, "
        f"{png_path.name} in {time.perf_counter() - started:.0f}s"
    )
    return md_path


def main(config: Config, args) -> None:
    run(config, args.sizes, parse_seeds(args.seeds))
