"""A finished comparison's stored runs, read back as the comparison's own :class:`Candidate` so a probe hands them to
the product's functions (``part_scores``, ``evaluated_rows``, ``choose_fusion``, ``cascade``) instead of copies.

Reads a run's reports folder: its test, validation and sentence-crop predictions, as ``make evaluate`` (or the
comparison, for NBSVM) wrote them. Writes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.core.catalog import CROP_PREDICTIONS_FILE, TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE
from pipeline.core.errors import MissingInputError
from pipeline.stages.compare.candidates import NBSVM, Candidate

PREDICTION_FILES = {"val": VAL_PREDICTIONS_FILE, "test": TEST_PREDICTIONS_FILE}  # the evaluated splits' files


def nbsvm_folder(reports_dir: Path, name: str | None = None) -> Path:
    """The comparison's NBSVM folder in ``reports_dir``: ``name``, or the one the comparison wrote there."""
    found = [reports_dir / name] if name else sorted(reports_dir.glob(f"baseline-{NBSVM}-*"))
    if not found or not found[0].is_dir():
        raise MissingInputError(f"no NBSVM folder in {reports_dir}/: run `make compare` with this config first")
    return found[0]


def stored_candidate(folder: Path, splits: dict[str, pd.DataFrame], kind: str = "transformer") -> Candidate:
    """The run evaluated in ``folder`` on the rows of ``splits`` (``val`` and ``test``, ingested frames or some of
    their rows), matched by source file in the splits' order, and its crops of those reviews."""
    kept = {
        split: pd.read_parquet(folder / file).set_index("source_file").loc[splits[split]["source_file"]].reset_index()
        for split, file in PREDICTION_FILES.items()
    }
    crops = pd.read_parquet(folder / CROP_PREDICTIONS_FILE)
    crops = pd.concat(
        [
            crops[(crops["split"] == split) & crops["source_file"].isin(set(splits[split]["source_file"]))]
            for split in PREDICTION_FILES
        ],
        ignore_index=True,
    )
    return Candidate(folder.name, kind, None, folder.name, {}, kept["test"], kept["val"], folder=folder, crops=crops)
