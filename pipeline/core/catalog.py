"""The catalog: the shape of a stage table entry, where the stages' outputs live and every file name they hand on.

:class:`Stage` is one entry of a table of sub-commands: the product's stages
(:data:`pipeline.stages.STAGES`) and the lab's experiments (``lab.experiments.EXPERIMENTS``, outside the product).
:data:`FOLDERS` names each stage's output folder under ``paths.data_dir`` once;
:func:`stage_dir` and :func:`require_output` are how any module finds them, so a folder's
location and the "run ``make X`` first" message are written once. Nothing here imports a stage.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.core.errors import MissingInputError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT_VERSION = 1

# --------------------------------------------------------------------------- the catalog
# Every file one stage writes and another reads, named once. A stage's private files (its plots,
# its checkpoints) are named in the stage itself.

SPLITS = ("train", "val", "test")
LABELS_FILE = "labels.json"  # class names in index order: ingest, tokenize, every model
MODEL_LABELS_DIR = "model_labels"  # an NBSVM candidate's labels.json alone: what its logged model carries
UNLABELED_TABLE = "unlabeled.parquet"  # ingest -> tokenize, pseudo-label
VOCABULARY_FILE = "vocabulary.txt"  # tokenize -> train, every model
TOKENIZER_SETTINGS_FILE = "tokenizer.json"  # tokenize -> train, every model
TOKEN_LENGTHS_PLOT = "token_lengths.png"  # tokenize -> train (logged with the run)
BACKBONE_WEIGHTS_FILE = "backbone.weights.npz"  # pretrain -> train
BACKBONE_SPEC_FILE = "backbone.json"  # pretrain -> train
BACKBONE_SNAPSHOTS_DIR = "snapshots"  # pretrain -> pretrain-budget: snapshots/<minutes>min/
PSEUDO_LABELS_FILE = "pseudo_labels.parquet"  # pseudo-label -> train
PSEUDO_CROPS_FILE = "training_crops.parquet"  # pseudo-label -> train: sentence crops of train reviews
KERAS_MODEL_FILE = "model.keras"  # train -> evaluate, the pyfunc model
MODEL_SETTINGS_FILE = "model_settings.json"  # train -> every scorer: how the model reads a review (long_reviews)
TOKENIZER_DIR = "tokenizer"  # train: the tokenizer files carried with the model
BACKUP_DIR = "backup"  # train, pretrain: the state a killed fit resumes from
HISTORY_FILE = "history.json"  # train, pretrain: per-epoch (per-period) curves
METRICS_FILE = "metrics.json"  # evaluate -> compare, register, pretrain-budget
TEST_PREDICTIONS_FILE = "test_predictions.parquet"  # evaluate, compare's baselines -> compare, register
VAL_PREDICTIONS_FILE = "val_predictions.parquet"  # evaluate -> compare (fusion weights, the champion)
CROP_PREDICTIONS_FILE = "crop_predictions.parquet"  # evaluate -> compare (the sentence crops: short texts)
# compare's NBSVM -> a cascade's figure: per validation row (source_file), whether the C chosen on the other half of
# validation gets it right (the rows of NBSVM's cross-fitted accuracy)
CROSS_FITTED_ROWS_FILE = "val_cross_fitted.parquet"
LEXICAL_MODEL_FILE = "nbsvm.npz"  # compare's NBSVM baseline (``pipeline.lexical.NbsvmArrays``) -> its fused models
FUSION_FILE = "fusion.json"  # a fused model's weight
COMPARISON_REPORT = "comparison"  # compare -> register, pretrain-budget: reports/comparison.*
SAVED_MODEL_DIR = "saved_model"  # export -> TF Serving, any TensorFlow process: the SavedModel
SHORT_REVIEWS_TABLE = "reviews.parquet"  # short-reviews -> ingest (data.source: table)
EXPORT_SETTINGS_FILE = "export.json"  # export -> bench: what was exported, its size, the identity check


def split_table(split: str) -> str:
    """``train.parquet``: one split of ingest's output (``SPLITS``)."""
    return f"{split}.parquet"


def ids_file(split: str) -> str:
    """``train_ids.npy``: tokenize's int32 ``[rows, max_sequence_length]`` token ids of a split (or ``unlabeled``)."""
    return f"{split}_ids.npy"


UNLABELED = "unlabeled"  # tokenize's ids of the unlabeled reviews: no labels, no split
UNLABELED_IDS_FILE = ids_file(UNLABELED)  # tokenize -> pretrain, train (pseudo labels)


def labels_file(split: str) -> str:
    """``train_labels.npy``: tokenize's class indices of a split."""
    return f"{split}_labels.npy"


def teacher_probability_column(index: int) -> str:
    """The column of ``pseudo_labels.parquet`` holding the teacher's probability of class ``index`` (soft targets)."""
    return f"probability_{index}"


def token_counts_file(split: str) -> str:
    """``train_token_counts.npy``: tokens per review before truncation."""
    return f"{split}_token_counts.npy"


# stage name -> its output folder under paths.data_dir (stages without one write to MLflow or reports/)
FOLDERS = {
    "ingest": "ingest",
    "tokenize": "tokenize",
    "pretrain": "pretrain",
    "pseudo-label": "pseudo_label",
    "train": "train",
    "export": "export",
    "short-reviews": "short_reviews",
}


@dataclass(frozen=True)
class Stage:
    """One sub-command: ``python -m pipeline <name>`` runs ``<module>.main(config, args)``; ``make <name>`` too.

    ``<module>.run(config, ...)`` is the same step as a function (what tests call).
    """

    name: str
    module: str
    help: str
    reads: tuple[str, ...]  # upstream stages whose outputs it needs (make builds their folders first)
    writes: str  # what it writes, for people
    force: bool = False  # offers --force (and honours it)
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    # upstream stages whose work or output it uses beyond ``reads``: work it does itself (compare trains and
    # evaluates), outputs it makes first when the config asks for them, saying so in a line of its own (pseudo
    # labels), or reads only when the config names them (a pretrained backbone); make does not build them first
    runs: tuple[str, ...] = ()
    # whether it always runs TensorFlow (started quietly before it runs); a stage that only may (scoring a
    # Transformer) starts it quietly when it loads one (``pipeline.core.logs.start_tensorflow_quietly``)
    tensorflow: bool = True
    # whether it writes under paths.data_dir (one writer at a time: ``pipeline.core.locks``); readers take no lock
    locks: bool = True

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
    parser.add_argument(
        "--model",
        default=None,
        help="models:/NAME@ALIAS, runs:/RUN_ID/model or a local model folder "
        "(default: models:/<registered name>@champion)",
    )


class HasDataDir(Protocol):
    """What finding a stage's folder needs of a config: ``paths.data_dir`` (``pipeline.config.Config`` has it)."""

    @property
    def data_dir(self) -> Path: ...


def stage_dir(config: HasDataDir, name: str) -> Path:
    """The output folder of stage ``name`` under ``paths.data_dir``."""
    if name not in FOLDERS:
        raise KeyError(f"stage {name!r} has no output folder")
    return config.data_dir / FOLDERS[name]


def require_output(config: HasDataDir, name: str) -> Path:
    """The folder of upstream stage ``name``; an error naming the ``make`` target when it has not run."""
    directory = stage_dir(config, name)
    if not (directory / MANIFEST_NAME).is_file():
        raise MissingInputError(f"no {name} output in {directory}/: run `make {name}` first")
    return directory
