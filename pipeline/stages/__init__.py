"""The product's stages, one package per ``make`` target, and the declared table of them (:data:`STAGES`).

``python -m pipeline`` builds its sub-commands from this table (the lab's experiments have a table and a command
line of their own, ``python -m lab``, outside the product); ``make help`` and the README's stage table list the
same stages, and the Makefile's prerequisites follow the table's ``reads`` (tests check all three).
A stage's package holds its entry point in ``__init__`` (``run`` and ``main``, importing its work only when
it runs) and its own logic beside it; it imports the shared libraries (``pipeline.core``, ``text``, ``model``,
``runtime``, ``lexical``, ``metrics``, ``tracking``) and the packages of the stages it ``reads`` or ``runs``
(their ``outputs`` readers, or their work), never one downstream. No library imports a stage.

Importing this package is cheap: a stage's work is imported only when it runs.
"""

from __future__ import annotations

import argparse

from pipeline.core.catalog import Stage, model_argument
from pipeline.stages.compare.designs import DESIGN_NAMES


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", default="latest", help="MLflow run id to evaluate, or 'latest' (default)")


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--design",
        choices=DESIGN_NAMES,
        default="main",
        help="main (default): the factors and levels of the config's compare section, the NBSVM "
        "baseline and the fused candidates; position and tuned are the experiments "
        "ablate-position and compare-tuned (pipeline/stages/compare/designs.yaml)",
    )


def _score_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        required=True,
        help="CSV file of reviews to score; with --engine spark also Parquet, a folder or a glob",
    )
    parser.add_argument(
        "--output",
        required=True,
        help="CSV file to write (never the input); with --engine spark a folder of part files",
    )
    model_argument(parser)
    parser.add_argument("--text-column", default="text", help="column holding the review text (default: text)")
    parser.add_argument("--encoding", default="utf-8-sig", help="input encoding (default: utf-8 with optional BOM)")
    parser.add_argument("--chunk-size", type=int, default=2048, help="rows read and scored at a time")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="add an explanation column: the words or n-grams that moved each row's score most",
    )
    parser.add_argument("--explain-top", type=int, default=5, help="items an explanation lists (default 5)")
    parser.add_argument(
        "--engine",
        choices=("local", "spark"),
        default="local",
        help="local: stream the CSV through this process (default); spark: Spark with spark.master",
    )
    parser.add_argument(
        "--output-format",
        choices=("parquet", "csv"),
        default=None,
        help="spark only: part files to write (default: spark.output_format, parquet)",
    )
    parser.add_argument("--overwrite", action="store_true", help="spark only: replace an existing output folder")
    parser.add_argument(
        "--keep-row-index",
        action="store_true",
        help="spark only: keep the row_index column (monotonically increasing in input order)",
    )


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    model_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    parser.add_argument("--port", type=int, default=5001, help="port (default 5001)")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn processes, each with the model (default 1)")
    parser.add_argument(
        "--max-body-bytes", type=int, default=8_000_000, help="larger requests get 413 (default 8000000)"
    )
    parser.add_argument("--max-rows", type=int, default=10_000, help="requests with more rows get 413 (default 10000)")


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    model_argument(parser)
    parser.add_argument(
        "--check-rows",
        type=int,
        default=None,
        help="test reviews the exported graph must score as make score does (default: all)",
    )


def _ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    parser.add_argument("--print-only", action="store_true", help="print the links without starting the server")


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "ingest",
            "pipeline.stages.ingest",
            "IMDB archive or your tables -> data/ingest/{train,val,test}.parquet",
            reads=(),
            writes="train/val/test Parquet splits, labels.json, manifest",
            force=True,
            tensorflow=False,
        ),
        Stage(
            "tokenize",
            "pipeline.stages.tokenize",
            "learn the WordPiece vocabulary on train, encode all splits",
            reads=("ingest",),
            writes="vocabulary, tokenizer settings, token ids per split, manifest",
            force=True,
        ),
        Stage(
            "pretrain",
            "pipeline.stages.pretrain",
            "masked-LM pretraining of the encoder on train + unlabeled reviews",
            reads=("tokenize",),
            writes="backbone weights, spec, loss curve, manifest; one MLflow run",
            force=True,
        ),
        Stage(
            "pseudo-label",
            "pipeline.stages.pseudo_label",
            "label the unlabeled reviews with the NBSVM (or TF-IDF) teacher, keep the sure ones",
            reads=("ingest",),
            writes="pseudo_labels.parquet, a confidence histogram, manifest; one MLflow run",
            force=True,
        ),
        Stage(
            "train",
            "pipeline.stages.train",
            "train the Transformer classifier, log the run and its model to MLflow",
            reads=("tokenize", "ingest"),
            runs=("pseudo-label", "pretrain"),  # as the config asks
            writes="a run folder with model.keras and a manifest; one MLflow run",
            force=True,
        ),
        Stage(
            "evaluate",
            "pipeline.stages.evaluate",
            "score the test split with a trained run, log test_ metrics and plots",
            reads=("ingest", "train"),
            writes="test_ metrics and plots on the run; reports/<run_id>/",
            force=True,
            arguments=_evaluate_arguments,
        ),
        Stage(
            "compare",
            "pipeline.stages.compare",
            "every candidate (Transformer variants x seeds, NBSVM, their fusion) "
            "trained, evaluated and compared on one protocol",
            reads=("tokenize", "ingest"),
            runs=("pretrain", "pseudo-label", "train", "evaluate"),
            writes="an MLflow parent run with its children; reports/comparison.*",
            force=True,
            arguments=_compare_arguments,
        ),
        Stage(
            "register",
            "pipeline.stages.register",
            "register the candidate with the best validation accuracy of the latest comparison as @champion",
            reads=("compare",),
            writes="a registered model version with the alias champion",
            force=True,
            tensorflow=False,
        ),
        Stage(
            "score",
            "pipeline.stages.score",
            "add probabilities and labels to every row of a CSV of reviews",
            reads=("register",),
            writes="the CSV with probability, label and score_error columns",
            arguments=_score_arguments,
            tensorflow=False,  # scoring a Transformer starts it when it loads the model
            locks=False,
        ),
        Stage(
            "serve",
            "pipeline.stages.serve",
            "serve a model (default: the champion) over HTTP: MLflow's scoring server, requests checked first",
            reads=("register",),
            writes="nothing (answers POST /invocations on 127.0.0.1)",
            arguments=_serve_arguments,
            tensorflow=False,
            locks=False,
        ),
        Stage(
            "export",
            "pipeline.stages.export",
            "a model (default: the champion) as one TensorFlow SavedModel, raw "
            "text in, checked to answer as make score does on the test split",
            reads=("register", "ingest"),
            writes="data/export/saved_model/, export.json, manifest; the SavedModel "
            "logged on the model's run and named on its registered version",
            arguments=_export_arguments,
        ),
        Stage(
            "ui",
            "pipeline.stages.ui",
            "print links to the latest comparison, then serve the MLflow UI on 127.0.0.1",
            reads=("compare",),
            writes="nothing (serves the tracking store)",
            arguments=_ui_arguments,
            tensorflow=False,
            locks=False,
        ),
    )
}
