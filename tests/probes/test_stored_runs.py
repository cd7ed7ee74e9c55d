"""The probes' reader of a finished comparison's runs (``lab.probes.stored_runs``): a run folder written as the
evaluation writes it reads back as the comparison's candidate, on the rows asked for and in their order, and the
product's ``part_scores`` and ``evaluated_rows`` take it; every probe imports (they call the product's functions)."""

from __future__ import annotations

import importlib

import numpy as np
import pandas as pd
import pytest

from lab.probes.stored_runs import PREDICTION_FILES, nbsvm_folder, stored_candidate
from pipeline.core.catalog import CROP_PREDICTIONS_FILE
from pipeline.core.errors import MissingInputError
from pipeline.core.predictions import prediction_frame
from pipeline.stages.compare.producers import evaluated_rows, part_scores
from pipeline.stages.evaluate.lengths import crop_frames, crop_predictions
from pipeline.stages.tokenize.outputs import IngestedRows
from tests.conftest import PROJECT_ROOT

NAMES = ["neg", "pos"]


def split_frame(split: str, rows: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "text": [f"Review {i} of {split}. It was {'good' if i % 2 else 'bad'}. The end." for i in range(rows)],
            "label": [i % 2 for i in range(rows)],
            "source_file": [f"{split}/{i}.txt" for i in range(rows)],
        }
    )


def write_run(folder, splits: dict[str, pd.DataFrame], seed: int) -> dict[str, np.ndarray]:
    """A run's evaluation files as ``make evaluate`` writes them; returns the probabilities written per split."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    written = {}
    for split, frame in splits.items():
        positive = rng.random(len(frame))
        written[split] = np.stack([1 - positive, positive], axis=1)
        predictions = prediction_frame(frame["source_file"], frame["label"].to_numpy(), written[split], NAMES)
        predictions.to_parquet(folder / PREDICTION_FILES[split])
    crops = crop_frames(splits["val"], splits["test"])
    crop_p = {split: np.full((len(frame), 2), 0.5) for split, frame in crops.items()}
    crop_predictions(crops, crop_p, NAMES).to_parquet(folder / CROP_PREDICTIONS_FILE)
    return written


def test_a_stored_run_reads_back_as_the_comparisons_candidate_on_the_rows_asked_for(tmp_path):
    splits = {"val": split_frame("val", 12), "test": split_frame("test", 10)}
    written = write_run(tmp_path / "reports" / "run-1", splits, seed=0)
    write_run(tmp_path / "reports" / "baseline-nbsvm-abc", splits, seed=1)

    some = {"val": splits["val"].iloc[[7, 2, 5]], "test": splits["test"].iloc[[9, 0]]}  # other rows, other order
    candidate = stored_candidate(tmp_path / "reports" / "run-1", some)
    assert candidate.kind == "transformer" and candidate.run_id == "run-1"
    assert candidate.predictions["source_file"].tolist() == ["test/9.txt", "test/0.txt"]
    assert set(candidate.crop_predictions()["source_file"]) == {"val/7.txt", "val/2.txt", "val/5.txt"} | {
        "test/9.txt",
        "test/0.txt",
    }
    scores = part_scores(candidate, NAMES)
    assert np.allclose(scores.val, written["val"][[7, 2, 5]]) and np.allclose(scores.test, written["test"][[9, 0]])

    whole = stored_candidate(tmp_path / "reports" / "run-1", splits)
    frames = IngestedRows(splits["val"].iloc[:0], splits["val"], splits["test"], NAMES, "", None)
    rows = evaluated_rows(frames, whole)
    assert len(rows.val_labels) == 12 and len(rows.crop_words["test"]) == len(whole.crop_predictions()) - 12

    lexical = stored_candidate(nbsvm_folder(tmp_path / "reports"), splits, "nbsvm")
    assert lexical.kind == "nbsvm" and lexical.run_id == "baseline-nbsvm-abc"


def test_a_missing_nbsvm_folder_names_the_target_to_run(tmp_path):
    with pytest.raises(MissingInputError, match="run `make compare`"):
        nbsvm_folder(tmp_path)
    with pytest.raises(MissingInputError, match="no NBSVM folder"):
        nbsvm_folder(tmp_path, "baseline-nbsvm-gone")


@pytest.mark.parametrize("path", sorted((PROJECT_ROOT / "lab" / "probes").glob("*.py")), ids=lambda p: p.stem)
def test_every_probe_imports_the_product_functions_it_calls(path):
    module = importlib.import_module(f"lab.probes.{path.stem}")
    assert module.__doc__
