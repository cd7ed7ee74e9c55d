"""The recorder: a new kind of candidate is one producer and one row of the kinds table. A toy kind walks through it:
its run under the comparison, parameters, its own and the evaluation's metrics, its model, its files and its line;
a finished run is reused without computing again; ``force`` computes anew."""

from pathlib import Path

import mlflow
import pandas as pd
import pytest

from pipeline.core.catalog import (
    CROP_PREDICTIONS_FILE,
    LABELS_FILE,
    TEST_PREDICTIONS_FILE,
    VAL_PREDICTIONS_FILE,
    require_output,
)
from pipeline.core.files import atomic_write_json
from pipeline.model.kinds import KINDS
from pipeline.stages.compare.recorder import Produced, Slot, record
from pipeline.stages.tokenize.outputs import read_ingested_rows
from pipeline.tracking import PARENT_RUN_TAG, setup_tracking
from tests.model.toy_kind import GoodWordModel  # a toy kind: the more "good", the likelier positive

TOY_TAG = "toy_kind"


def produce_toy(names, out_dir: Path, computed: list) -> Produced:
    computed.append(out_dir)
    atomic_write_json(out_dir / LABELS_FILE, {"labels": list(names)})
    artifacts = GoodWordModel.artifacts(out_dir)
    return Produced(
        GoodWordModel.from_artifacts(artifacts),
        {"toy.word": "good"},
        {"val_accuracy_cross_fitted": 0.5},
        "counted the word 'good'",
        artifacts=artifacts,
    )


def test_a_toy_kind_walks_through_the_recorder(prepared_config, monkeypatch, capsys):
    monkeypatch.setitem(KINDS, "toy", GoodWordModel)  # a new kind: its module and one line in the registry
    frames = read_ingested_rows(require_output(prepared_config, "ingest"), require_output(prepared_config, "tokenize"))
    setup_tracking(prepared_config.tracking)
    out_dir = prepared_config.reports_dir / "toy"
    finished = {}

    def find():
        return mlflow.get_run(finished["id"]) if "id" in finished else None

    slot = Slot("toy", "toy", None, out_dir, "toy-run", {TOY_TAG: "yes"}, find, "Toy kind")
    computed: list = []
    with mlflow.start_run(run_name="comparison") as parent:
        candidate = record(slot, lambda folder: produce_toy(frames.labels, folder, computed), frames, force=False)
        finished["id"] = candidate.run_id
        reused = record(slot, lambda folder: pytest.fail("a finished run is computed again"), frames, force=False)
        forced = record(slot, lambda folder: produce_toy(frames.labels, folder, computed), frames, force=True)

    run = mlflow.get_run(candidate.run_id)
    assert run.data.tags[PARENT_RUN_TAG] == parent.info.run_id and run.data.tags[TOY_TAG] == "yes"
    assert run.info.run_name == "toy-run" and run.data.params["toy.word"] == "good"
    expected = float(
        (frames.test["text"].str.lower().str.count("good").to_numpy() > 0.5)
        .astype(int)
        .__eq__(frames.test["label"].to_numpy())
        .mean()
    )
    assert run.data.metrics["test_accuracy"] == pytest.approx(expected)
    assert candidate.metrics["test_accuracy"] == pytest.approx(expected)
    assert (
        candidate.metrics["selection_val_accuracy"] == reused.metrics["selection_val_accuracy"] == 0.5
        and "val_crop_accuracy" in candidate.metrics
    )
    logged = mlflow.pyfunc.load_model(f"runs:/{candidate.run_id}/model")
    scored = logged.predict(pd.DataFrame({"text": ["good good film", "dull"]}))
    assert scored["predicted_label"].tolist() == [frames.labels[1], frames.labels[0]]
    for name in (TEST_PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, CROP_PREDICTIONS_FILE):
        assert (out_dir / name).is_file()
    assert len(candidate.predictions) == len(frames.test) and len(candidate.val_predictions) == len(frames.val)
    pd.testing.assert_frame_equal(reused.predictions, candidate.predictions)
    assert reused.run_id == candidate.run_id and reused.metrics == candidate.metrics
    assert forced.run_id != candidate.run_id and computed == [out_dir, out_dir]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("compare: Toy kind: ")]
    assert len(lines) == 2 and lines[0] == (
        f"compare: Toy kind: counted the word 'good'; test_accuracy {candidate.metrics['test_accuracy']:.4f}"
    )


def test_a_kind_missing_from_the_table_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown kind of candidate 'toy' "):
        Slot("toy", "toy", None, tmp_path / "toy", "toy-run", {}, lambda: None, "Toy")
    assert not (tmp_path / "toy").exists()
