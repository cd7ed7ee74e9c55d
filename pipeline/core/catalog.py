"""The shape of a stage table entry and where the stages' outputs live.

:class:`Stage` is one entry of a table of sub-commands: the product's stages
(:data:`pipeline.stages.STAGES`) and the experiments (:data:`pipeline.experiments.EXPERIMENTS`).
:data:`FOLDERS` names each stage's output folder under ``paths.data_dir`` once;
:func:`stage_dir` and :func:`require_output` are how any module finds them, so a folder's
location and the "run ``make X`` first" message are written once. Nothing here imports a stage.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.config import Config
from pipeline.core.errors import MissingInputError
from pipeline.core.files import MANIFEST_NAME

# stage name -> its output folder under paths.data_dir (stages without one write to MLflow or reports/)
FOLDERS = {"ingest": "ingest", "tokenize": "tokenize", "pretrain": "pretrain", "pseudo-label": "pseudo_label",
           "train": "train"}


@dataclass(frozen=True)
class Stage:
    """One sub-command: ``python -m pipeline <name>`` runs ``<module>.main(config, args)``; ``make <name>`` too.

    ``<module>.run(config, ...)`` is the same step as a function (what tests call).
    """

    name: str
    module: str
    help: str
    reads: tuple[str, ...]          # upstream stages whose outputs it needs (make builds their folders first)
    writes: str                     # what it writes, for people
    force: bool = False             # offers --force (and honours it)
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    # upstream stages whose work or output it uses beyond ``reads``: work it does itself (compare trains and
    # evaluates), outputs it makes first when the config asks for them, saying so in a line of its own (pseudo
    # labels), or reads only when the config names them (a pretrained backbone); make does not build them first
    runs: tuple[str, ...] = ()

    @property
    def upstream(self) -> tuple[str, ...]:
        """Every stage it reads or runs: the stages whose packages it may import."""
        return (*self.reads, *self.runs)

    @property
    def folder(self) -> str | None:
        """Its output folder under ``paths.data_dir``, when it has one."""
        return FOLDERS.get(self.name)


def model_argument(parser: argparse.ArgumentParser) -> None:
    """``--model``, for every sub-command that loads a logged model."""
    parser.add_argument("--model", default=None,
                        help="models:/NAME@ALIAS, runs:/RUN_ID/model or a local model folder "
                             "(default: models:/<registered name>@champion)")


def stage_dir(config: Config, name: str) -> Path:
    """The output folder of stage ``name`` under ``paths.data_dir``."""
    if name not in FOLDERS:
        raise KeyError(f"stage {name!r} has no output folder")
    return config.data_dir / FOLDERS[name]


def require_output(config: Config, name: str) -> Path:
    """The folder of upstream stage ``name``; an error naming the ``make`` target when it has not run."""
    directory = stage_dir(config, name)
    if not (directory / MANIFEST_NAME).is_file():
        raise MissingInputError(f"no {name} output in {directory}/: run `make {name}` first")
    return directory
