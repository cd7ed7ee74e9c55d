"""The prepared GPU check (``make gpu-check-bundle`` here, ``tools/gpu_check/run.sh`` there), dry-run on the CPU:
the bundle from the suite's data, then the check in a process on Keras' JAX backend where TensorFlow cannot be
imported (``no_tensorflow.py``), as on the GPU machine. The comparison it runs trains and evaluates on JAX, and the
model it logs scores the same in this TensorFlow process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.core.catalog import ids_file
from pipeline.core.errors import InputError
from pipeline.core.predictions import from_probability_columns
from tests.conftest import PROJECT_ROOT

CHECK_SETTINGS = ["training.epochs=1", "compare.poolings=null", "compare.seeds=[1]"]  # one Transformer: the suite's


def test_the_check_runs_the_comparison_on_jax_without_tensorflow_and_its_model_scores_alike_on_tensorflow(
    prepared_config, tmp_path
):
    from lab.experiments.gpu_check import BUNDLE_FILE, STORE_FILE, make_bundle
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.ingest.outputs import read_split
    from pipeline.text.conventions import load_labels

    bundle = tmp_path / "bundle"
    payload = make_bundle(prepared_config, bundle, wheels=False)
    assert not any((bundle / "data" / "tokenize" / ids_file(split)).exists() for split in ("train", "val", "test"))
    assert (
        payload["stored_texts"]
        > sum(len(read_split(prepared_config.data_dir / "ingest", s)) for s in ("train", "val", "test")) - 5
    )  # every split's text (a few repeat), and more
    out, work = tmp_path / "out", tmp_path / "check"  # (tmp_path / "work" is this test's working folder)
    command = [
        sys.executable,
        str(PROJECT_ROOT / "tests" / "experiments" / "no_tensorflow.py"),
        "-m",
        "lab",
        "gpu-check",
        "--bundle",
        str(bundle),
        "--out",
        str(out),
        "--work",
        str(work),
        *(part for setting in CHECK_SETTINGS for part in ("--set", setting)),
    ]
    environment = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(PROJECT_ROOT),
        "PIPELINE_QUIET": "1",
    }
    environment.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Keras backend jax" in done.stdout and "CPU (" in done.stdout
    progress = [line for line in done.stdout.splitlines() if line.startswith("compare: [")]  # one per candidate
    assert [line.split("]")[0] for line in progress] == [
        "compare: [1/4",
        "compare: [2/4",
        "compare: [3/4",
        "compare: [4/4",
    ]
    assert "Transformer seed 1" in progress[0] and "(4 candidates)" in done.stdout
    assert progress[1].endswith(
        "elapsed, NBSVM, fusion and TF-IDF left, not timed yet"
    )  # not guessed from another kind

    summary = (out / "summary.md").read_text()
    assert "| first_token-learned-seed1 | CPU (" in summary and "| float32 | 1 |" in summary
    for candidate in ("transformer", "nbsvm", "nbsvm+transformer", "tfidf"):
        assert f"| {candidate} | 1 |" in summary
    comparison = json.loads((out / "comparison.json").read_text())
    assert sorted(path.name for path in out.iterdir()) == [
        "comparison.json",
        "comparison.md",
        "comparison.png",
        "mlflow.db",
        "summary.md",
    ]

    # the logged Transformer, trained and evaluated on JAX, scores the test split alike on TensorFlow
    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    run_id = comparison["summary"]["transformer"]["run_ids"][0]
    run = mlflow.get_run(run_id)
    assert run.data.tags["keras_backend"] == "jax" and run.data.params["training.sparse_updates"] == "True"
    assert int(run.data.params["model.ngram_max"]) == 3
    names = load_labels(work / "data" / "ingest")
    on_jax = from_probability_columns(pd.read_parquet(work / "reports" / run_id / "test_predictions.parquet"), names)
    test = read_split(work / "data" / "ingest", "test")
    on_tensorflow = load_classifier(f"runs:/{run_id}/model").probabilities(test["text"].tolist())
    assert on_jax.shape == on_tensorflow.shape == (len(test), 2)
    np.testing.assert_allclose(on_tensorflow, on_jax, atol=1e-5)

    # the ids rebuilt there from the token store are byte for byte the tokenize stage's
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(
            np.load(work / "data" / "tokenize" / ids_file(split)),
            np.load(prepared_config.data_dir / "tokenize" / ids_file(split)),
        )
    assert json.loads((bundle / BUNDLE_FILE).read_text())["ids_sha256"] and (bundle / STORE_FILE).is_file()


def test_a_bundle_whose_store_does_not_rebuild_the_ids_is_refused(prepared_config, tmp_path):
    from lab.experiments.gpu_check import BUNDLE_FILE, make_bundle, unpack

    bundle = tmp_path / "bundle"
    make_bundle(prepared_config, bundle, wheels=False)
    payload = json.loads((bundle / BUNDLE_FILE).read_text())
    payload["ids_sha256"]["val"] = "0" * 64  # as if the store held other tokens than the ids it was made with
    (bundle / BUNDLE_FILE).write_text(json.dumps(payload))
    with pytest.raises(InputError, match=r"val_ids.npy: rebuilt from .*tokens.npz, its checksum differs"):
        unpack(bundle, tmp_path / "data")


def test_the_wheels_carried_are_what_the_check_needs_less_the_devices_packages_and_tensorflow():
    from lab.experiments.gpu_check import DEVICE_PACKAGES, canonical, carried_packages

    device = {canonical(line) for line in DEVICE_PACKAGES.read_text().splitlines() if line and line[0] != "#"}
    assert {"jax", "numpy", "pandas", "pyarrow", "scikit-learn", "rich", "h5py"} <= device
    carried = carried_packages(device)
    assert {"keras", "keras-hub", "mlflow-skinny", "sqlalchemy", "alembic", "optree"} <= set(carried)
    assert not set(carried) & (device | {"tensorflow", "tensorflow-text", "mlflow"})
    assert carried["keras"] == __import__("keras").__version__
    nothing_there = carried_packages(set())
    assert {"numpy", "rich"} <= set(nothing_there) and "tensorflow-text" not in nothing_there
    assert Path(PROJECT_ROOT / "tools" / "gpu_check" / "run.sh").stat().st_mode & 0o111


def test_the_bundle_carries_the_unlabeled_reviews_only_when_the_config_reads_them_and_stays_within_a_device_call(
    prepared_config, tmp_path, monkeypatch
):
    from lab.experiments import gpu_check
    from pipeline.core.catalog import UNLABELED_IDS_FILE, UNLABELED_TABLE
    from pipeline.core.errors import ConfigError

    # the data folder holds the 150 unlabeled reviews and their ids, as a `make all` with $IMDB_UNSUP_ARCHIVE leaves it
    assert (prepared_config.data_dir / "ingest" / UNLABELED_TABLE).is_file()
    assert (prepared_config.data_dir / "tokenize" / UNLABELED_IDS_FILE).is_file()
    bundles = {}
    for crops in (0, 4):
        bundle = tmp_path / f"bundle-{crops}"
        gpu_check.make_bundle(prepared_config.replace(nbsvm={"unlabeled_crops_per_review": crops}), bundle, False)
        bundles[crops] = {str(path.relative_to(bundle)) for path in bundle.rglob("*") if path.is_file()}
    assert not any("unlabeled" in name for name in bundles[0])  # NBSVM without unlabeled crops: nothing of them
    assert bundles[4] - bundles[0] == {f"data/ingest/{UNLABELED_TABLE}"}  # with them: their texts, never their ids
    assert {"data/tokenize/vocabulary.txt", "config.yaml", "tokens.npz"} <= bundles[0]

    with pytest.raises(ConfigError, match=r"training.pseudo_labels=true: reads the unlabeled reviews' token ids"):
        gpu_check.make_bundle(prepared_config.replace(training={"pseudo_labels": True}), tmp_path / "p", False)
    assert not (tmp_path / "p").exists()

    monkeypatch.setattr(gpu_check, "CARRY_LIMIT", 2**10)  # a device call that carries 1 KiB
    with pytest.raises(
        ConfigError, match=r"MiB, over the 0.000976562 MiB a device call carries; removed .*Largest: \S+ \d"
    ):
        gpu_check.make_bundle(prepared_config, tmp_path / "big", False)
    assert not (tmp_path / "big").exists()
