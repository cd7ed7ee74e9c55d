"""Command line: ``python -m pipeline <stage> [--config FILE] [--set section.key=value ...]``.

The sub-commands come from the stage table (``pipeline.stages.STAGES``): every stage takes
``--config`` and ``--set``, ``--force`` where the stage honours it, and its own options. A
user's mistake (a ``PipelineError`` or a missing file) prints one ``error:`` line naming the
file, row or field and exits with status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from pipeline.config import load_config
from pipeline.errors import PipelineError
from pipeline.stages import STAGES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for stage in STAGES.values():
        sub = subparsers.add_parser(stage.name, help=stage.help, description=stage.help)
        sub.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
        sub.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
            help="override one config value, e.g. --set model.pooling=mean (repeatable)",
        )
        if stage.force:
            sub.add_argument("--force", action="store_true", help="run even when outputs are up to date")
        if stage.arguments is not None:
            stage.arguments(sub)
        sub.set_defaults(module_name=stage.module, entry=stage.entry)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        module = importlib.import_module(args.module_name)
        getattr(module, args.entry)(config, args)
    except (PipelineError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; outputs already written are intact", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
