"""The readers of ``make ingest``'s outputs, one per output, for every stage downstream of it.

``data/ingest/`` holds ``{train,val,test}.parquet`` (``review_id``, ``text``, ``label``, ``rating``, ...),
``unlabeled.parquet`` when the source had unlabeled reviews, and ``labels.json`` (read with
``pipeline.text.conventions.load_labels``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from pipeline.core.catalog import UNLABELED_TABLE, split_table


def split_path(ingest_dir: Path, split: str) -> Path:
    """The file of one split (``train``, ``val`` or ``test``)."""
    return ingest_dir / split_table(split)


def read_split(ingest_dir: Path, split: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One split, every column or only ``columns``."""
    return pd.read_parquet(split_path(ingest_dir, split), columns=None if columns is None else list(columns))


def unlabeled_path(ingest_dir: Path) -> Path | None:
    """The unlabeled reviews' file, or None when the source had none."""
    path = ingest_dir / UNLABELED_TABLE
    return path if path.is_file() else None


def read_unlabeled(ingest_dir: Path, columns: Sequence[str] | None = None) -> pd.DataFrame | None:
    """The unlabeled reviews, or None when the source had none."""
    path = unlabeled_path(ingest_dir)
    return None if path is None else pd.read_parquet(path, columns=None if columns is None else list(columns))
