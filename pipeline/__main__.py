"""Command line: ``python -m pipeline <stage> [--config FILE] [--set section.key=value ...]``.

The sub-commands come from the stage table (:data:`pipeline.stages.STAGES`): every one takes ``--config`` and
``--set``, ``--force`` where the stage honours it, and its own options. The lab's command line (``python -m lab``)
builds its experiments' sub-commands with the same :func:`build_parser` and runs them with :func:`run_command`. A
user's mistake (a ``PipelineError``: a bad config, input or model, ``MissingInputError`` for a file that
is not there) prints one ``error:`` line naming the file, row or field and exits with status 2; any
other exception is a bug and keeps its traceback, a bare ``FileNotFoundError`` included.
Third-party start-up lines stay out of the output unless ``-v`` or ``PIPELINE_VERBOSE=1``
(``pipeline.core.logs``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Mapping

from pipeline.config import load_config
from pipeline.core.catalog import Stage
from pipeline.core.errors import PipelineError, unreachable_tracking_server
from pipeline.core.locks import writer_lock
from pipeline.core.logs import VERBOSE_ENV, quiet_third_party, verbose_requested
from pipeline.runtime.hardware import cluster_from_env
from pipeline.stages import STAGES


def build_parser(
    table: Mapping[str, Stage] = STAGES, prog: str = "python -m pipeline", description: str = __doc__
) -> argparse.ArgumentParser:
    """One sub-command per entry of ``table`` (the stages by default), each with ``--config``, ``--set``, ``--force``
    where the entry honours it and the entry's own options; ``description``'s first line is the help's."""
    parser = argparse.ArgumentParser(prog=prog, description=description.splitlines()[0])
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=f"also show TensorFlow's C++ start-up lines and known third-party warnings (or {VERBOSE_ENV}=1)",
    )
    subparsers = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for stage in table.values():
        sub = subparsers.add_parser(stage.name, help=stage.help, description=stage.help)
        sub.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
        sub.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="SECTION.KEY=VALUE",
            help="override one config value, e.g. --set model.pooling=mean (repeatable)",
        )
        if stage.force:
            sub.add_argument("--force", action="store_true", help="run even when outputs are up to date")
        if stage.arguments is not None:
            stage.arguments(sub)
        sub.set_defaults(module_name=stage.module, tensorflow=stage.tensorflow, locks=stage.locks)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``parser`` (from :func:`build_parser`) and run the chosen entry's ``main``; the exit
    status: 0, 2 for a user's mistake (one ``error:`` line), 130 when interrupted."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    args = parser.parse_args(argv)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # for the processes a stage starts, too
    if not verbose_requested():
        quiet_third_party(tensorflow=args.tensorflow)
    try:
        config = load_config(args.config, args.overrides)
        module = importlib.import_module(args.module_name)
        command = " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)])
        with writer_lock(config.paths.data_dir, command) if takes_lock(args) else contextlib.nullcontext() as killed:
            if killed is not None:
                end_killed_runs(config, killed)
            module.main(config, args)
    except PipelineError as exc:  # only the user-fixable family: a bug's FileNotFoundError keeps its traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; outputs already written are intact", file=sys.stderr)
        return 130
    except Exception as exc:  # a team's tracking server gone away is the user's to restart; any other is a bug
        line = unreachable_tracking_server(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    return 0


def end_killed_runs(config, since: float) -> None:
    """The MLflow runs a killed command left RUNNING on this data folder, marked failed, with one line saying so."""
    from pipeline.tracking import fail_runs_left_running  # MLflow: only after a kill

    failed = fail_runs_left_running(config.tracking, since)
    if failed:
        print(f"marked {len(failed)} MLflow run(s) a killed command left running as failed: {', '.join(failed)}")


def takes_lock(args: argparse.Namespace) -> bool:
    """Whether the command holds its data folder's writer lock: a stage that writes, unless it is a worker of a
    multi-worker job other than the chief (the workers of one job run the same command on one folder together)."""
    if not args.locks:
        return False
    cluster = cluster_from_env()
    return cluster is None or cluster.is_chief


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
