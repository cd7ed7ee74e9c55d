"""The stages, one module per ``make`` target, and the declared table of them (:data:`STAGES`).

``python -m pipeline`` builds its sub-commands from :data:`STAGES`; ``make help`` and the
README's stage table list the same stages (a test checks both). Stage modules find their
own and their upstream folders through :func:`stage_dir` and :func:`require_output`, so a
stage's location and the "run ``make X`` first" message are written once.

Stages import the shared libraries in ``pipeline/``, never each other. A stage that drives
others (``compare`` trains and evaluates every variant, ``pretrain-budget`` pretrains, trains
and evaluates) runs them through :func:`run_stage`, as a runner would, with the stages it
drives declared in its ``reads``.

Importing this package is cheap: stage modules are imported only when their stage runs.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline.artifacts import MANIFEST_NAME
from pipeline.config import DESIGN_NAMES, Config
from pipeline.errors import MissingInputError


@dataclass(frozen=True)
class Stage:
    """One stage: ``python -m pipeline <name>`` runs ``<module>.main(config, args)``; ``make <name>`` too.

    ``<module>.run(config, ...)`` is the same stage as a function (what tests and other stages call).
    """

    name: str
    module: str
    help: str
    reads: tuple[str, ...]          # upstream stages whose outputs it reads (their folders or MLflow runs)
    writes: str                     # what it writes, for people
    folder: str | None = None       # its output folder under paths.data_dir, when it has one
    force: bool = False             # offers --force (and honours it)
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", default="latest", help="MLflow run id to evaluate, or 'latest' (default)")


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--design", choices=DESIGN_NAMES, default="main",
                        help="main (default): the factors and levels of the config's compare section, the NBSVM "
                             "baseline and the fused candidates; position: learned vs no positions (an ablation); "
                             "tuned: make tune's best config (compare.tuned) against this config, with NBSVM and "
                             "the fused candidates")


def _model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="models:/NAME@ALIAS, runs:/RUN_ID/model or a local model folder "
                             "(default: models:/<registered name>@champion)")


def _score_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True,
                        help="CSV file of reviews to score; with --engine spark also Parquet, a folder or a glob")
    parser.add_argument("--output", required=True,
                        help="CSV file to write (never the input); with --engine spark a folder of part files")
    _model_argument(parser)
    parser.add_argument("--text-column", default="text", help="column holding the review text (default: text)")
    parser.add_argument("--encoding", default="utf-8-sig", help="input encoding (default: utf-8 with optional BOM)")
    parser.add_argument("--chunk-size", type=int, default=2048, help="rows read and scored at a time")
    parser.add_argument("--engine", choices=("local", "spark"), default="local",
                        help="local: stream the CSV through this process (default); spark: Spark with spark.master")
    parser.add_argument("--output-format", choices=("parquet", "csv"), default=None,
                        help="spark only: part files to write (default: spark.output_format, parquet)")
    parser.add_argument("--overwrite", action="store_true", help="spark only: replace an existing output folder")
    parser.add_argument("--keep-row-index", action="store_true",
                        help="spark only: keep the row_index column (monotonically increasing in input order)")


def _tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=None,
                        help="finished trials the study should hold (default: tune.trials)")
    parser.add_argument("--trial", type=int, default=None,
                        help="also write this complete trial's config, reports/tune/trial-<n>.yaml, for "
                             "compare.tuned (the best one is always reports/tune/best.yaml)")


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    _model_argument(parser)
    parser.add_argument("--rows", type=int, default=25000, help="test reviews in the small CSV")
    parser.add_argument("--repeat", type=int, default=10, help="the big CSV is the small one repeated this often")
    parser.add_argument("--only", action="append", choices=("train", "score"),
                        help="measure only training steps or only scoring (repeatable; default: everything)")


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    _model_argument(parser)
    parser.add_argument("--port", type=int, default=5001, help="port on 127.0.0.1 (default 5001)")


def _ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    parser.add_argument("--print-only", action="store_true", help="print the links without starting the server")


def _screenshot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default=None, help="folder for the PNGs (default: <reports>/ui)")


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", default=None,
                        help="fine-tuning seeds per budget, comma-separated (default: compare.seeds)")
    parser.add_argument("--baseline", type=float, default=None,
                        help="lexical baseline test accuracy to draw on the plot (default: from reports/comparison.json)")


STAGES: dict[str, Stage] = {stage.name: stage for stage in (
    Stage("ingest", "pipeline.stages.ingest", "IMDB archive or your tables -> data/ingest/{train,val,test}.parquet",
          reads=(), writes="train/val/test Parquet splits, labels.json, manifest", folder="ingest", force=True),
    Stage("tokenize", "pipeline.stages.tokenize", "learn the WordPiece vocabulary on train, encode all splits",
          reads=("ingest",), writes="vocabulary, tokenizer settings, token ids per split, manifest",
          folder="tokenize", force=True),
    Stage("pretrain", "pipeline.stages.pretrain", "masked-LM pretraining of the encoder on train + unlabeled reviews",
          reads=("tokenize",), writes="backbone weights, spec, loss curve, manifest; one MLflow run",
          folder="pretrain", force=True),
    Stage("pseudo-label", "pipeline.stages.pseudo_label", "label the unlabeled reviews with the NBSVM (or TF-IDF) "
          "teacher, keep the sure ones",
          reads=("ingest",), writes="pseudo_labels.parquet, a confidence histogram, manifest; one MLflow run",
          folder="pseudo_label", force=True),
    Stage("train", "pipeline.stages.train", "train the Transformer classifier, log the run and its model to MLflow",
          reads=("tokenize", "ingest", "pseudo-label"),  # pseudo-label only with training.pseudo_labels
          writes="a run folder with model.keras and a manifest; one MLflow run",
          folder="train", force=True),
    Stage("evaluate", "pipeline.stages.evaluate", "score the test split with a trained run, log test_ metrics and plots",
          reads=("ingest", "train"), writes="test_ metrics and plots on the run; reports/<run_id>/",
          force=True, arguments=_evaluate_arguments),
    Stage("compare", "pipeline.stages.compare", "every candidate (Transformer variants x seeds, NBSVM, their fusion) "
          "trained, evaluated and compared on one protocol", reads=("tokenize", "ingest", "pretrain", "pseudo-label",
                                                                   "train", "evaluate"), writes="an MLflow parent run with its children; reports/comparison.*",
          force=True, arguments=_compare_arguments),
    Stage("register", "pipeline.stages.register", "register the candidate with the best validation accuracy of the "
          "latest comparison as @champion",
          reads=("compare",), writes="a registered model version with the alias champion", force=True),
    Stage("score", "pipeline.stages.score", "add probabilities and labels to every row of a CSV of reviews",
          reads=("register",), writes="the CSV with probability, label and score_error columns",
          arguments=_score_arguments),
    Stage("pretrain-budget", "pipeline.stages.pretrain_budget", "test accuracy against minutes of pretraining (an experiment)",
          reads=("pretrain", "train", "evaluate"), writes="reports/pretraining_budget.{json,md,png}",
          arguments=_budget_arguments),
    Stage("serve", "pipeline.stages.serve", "serve a model (default: the champion) over HTTP with mlflow models serve",
          reads=("register",), writes="nothing (answers POST /invocations on 127.0.0.1)",
          arguments=_serve_arguments),
    Stage("ui", "pipeline.stages.ui", "print links to the latest comparison, then serve the MLflow UI on 127.0.0.1",
          reads=("compare",), writes="nothing (serves the tracking store)", arguments=_ui_arguments),
    Stage("ui-screenshots", "pipeline.stages.ui_screenshots", "screenshots of the MLflow UI pages of the latest comparison",
          reads=("compare",), writes="reports/ui/{runs_table,comparison_run,compare_children}.png",
          arguments=_screenshot_arguments),
    Stage("tune", "pipeline.stages.tune", "an Optuna study over configs/tune.yaml, every trial an MLflow run; the best "
          "parameters as a config for make compare", reads=("tokenize", "ingest", "train"),
          writes="the study in Optuna storage; a parent MLflow run with a child per trial; reports/tune/best.yaml",
          arguments=_tune_arguments),
    Stage("bench", "pipeline.stages.bench", "training and scoring speed against the same run's GEMM peak; memory",
          reads=("tokenize", "ingest", "register"), writes="reports/bench.{json,md}", arguments=_bench_arguments),
)}


def stage_dir(config: Config, name: str) -> Path:
    """The output folder of stage ``name`` under ``paths.data_dir``."""
    folder = STAGES[name].folder
    if folder is None:
        raise KeyError(f"stage {name!r} has no output folder")
    return config.data_dir / folder


def require_output(config: Config, name: str) -> Path:
    """The folder of upstream stage ``name``; an error naming the ``make`` target when it has not run."""
    directory = stage_dir(config, name)
    if not (directory / MANIFEST_NAME).is_file():
        raise MissingInputError(f"no {name} output in {directory}/: run `make {name}` first")
    return directory


def run_stage(name: str, config: Config, **options: Any) -> Any:
    """Run stage ``name`` as a function: ``<module>.run(config, **options)`` (what a driving stage calls)."""
    return importlib.import_module(STAGES[name].module).run(config, **options)


def own_tokenization(config: Config, base: Config) -> Config:
    """``config`` as is when its tokenizer settings are ``base``'s; otherwise ``config`` reading a tokenization of
    its own, ``<base data>/tune/tokenize-<hash>/`` (made once: the tokenize stage skips it when up to date), with
    links to the base's ingestion, pseudo labels and pretraining, so that a tune trial or the tuned candidate of a
    comparison never overwrites the ids the base config trains on."""
    if config.section_hash("tokenizer") == base.section_hash("tokenizer"):
        return config
    folder = base.data_dir / "tune" / f"tokenize-{config.section_hash('tokenizer')[:8]}"
    folder.mkdir(parents=True, exist_ok=True)
    for stage in ("ingest", "pseudo-label", "pretrain"):  # what does not depend on the tokenization's ids
        source, link = stage_dir(base, stage), stage_dir(base, stage).name
        if source.is_dir() and not (folder / link).exists():
            try:
                (folder / link).symlink_to(source.resolve(), target_is_directory=True)
            except FileExistsError:  # another process made it first
                pass
    config = config.replace(paths={"data_dir": str(folder)})
    run_stage("tokenize", config)
    return config
