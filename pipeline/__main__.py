"""Command line: ``python -m pipeline <stage> [--config FILE] [--set section.key=value ...]``.

Every stage has the same options; stage-specific ones are added by the stage's
``add_arguments`` when it has one. Input errors print one ``error:`` line naming the
file, row or field and exit with status 2; no traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from pipeline.config import load_config

# stage name -> (module, one-line help). Modules are imported lazily so that
# `python -m pipeline ingest` does not pay for importing TensorFlow.
STAGES = {
    "ingest": ("pipeline.ingest", "IMDB archive -> data/ingest/{train,val,test}.parquet"),
    "tokenize": ("pipeline.tokenization", "learn WordPiece vocabulary on train, encode all splits"),
    "train": ("pipeline.train", "train the Transformer classifier, log the run to MLflow"),
    "evaluate": ("pipeline.evaluate", "score the test split with a trained run, log test_ metrics"),
    "compare": ("pipeline.compare", "first_token vs mean pooling over several seeds, plus a baseline"),
    "register": ("pipeline.registry", "register the best model of the latest comparison as @champion"),
    "score": ("pipeline.score", "add probabilities and labels to every row of a CSV of reviews"),
}


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", default="latest", help="MLflow run id to evaluate, or 'latest' (default)")


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--factor", choices=("pooling", "position"), default="pooling",
        help="what the comparison varies: model.pooling (default) or model.position",
    )


def _score_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="CSV file of reviews to score")
    parser.add_argument("--output", required=True, help="CSV file to write (never the input)")
    parser.add_argument(
        "--model", default=None,
        help="models:/NAME@ALIAS, runs:/RUN_ID/model or a local model folder (default: models:/<registered name>@champion)",
    )
    parser.add_argument("--text-column", default="text", help="column holding the review text (default: text)")
    parser.add_argument("--encoding", default="utf-8-sig", help="input encoding (default: utf-8 with optional BOM)")
    parser.add_argument("--chunk-size", type=int, default=2048, help="rows read and scored at a time")


STAGE_ARGUMENTS = {"evaluate": _evaluate_arguments, "compare": _compare_arguments, "score": _score_arguments}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for name, (module_name, help_text) in STAGES.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
        sub.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
            help="override one config value, e.g. --set model.pooling=mean (repeatable)",
        )
        sub.add_argument("--force", action="store_true", help="run even when outputs are up to date")
        sub.set_defaults(module_name=module_name)
        STAGE_ARGUMENTS.get(name, lambda _: None)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        module = importlib.import_module(args.module_name)
        module.main(config, args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; outputs already written are intact", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
