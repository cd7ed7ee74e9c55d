"""``BACKEND=jax make train`` and ``make evaluate``: the stages on Keras' JAX backend (a subprocess, since Keras
reads ``KERAS_BACKEND`` once), n-grams and lazy embedding updates included; the model they log scores the same in
this TensorFlow process; what only TensorFlow does is one error naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.core.predictions import from_probability_columns
from tests.conftest import PROJECT_ROOT


def run_cli(config, backend: str, *arguments: str, tracking_uri: str) -> subprocess.CompletedProcess:
    settings = [f"data.archive={config.data.archive}", f"paths.data_dir={config.data_dir}",
                f"paths.reports_dir={config.reports_dir}", f"tracking.tracking_uri={tracking_uri}"]
    command = [sys.executable, "-m", "pipeline", *arguments, "--config", str(PROJECT_ROOT / "configs" / "smoke.yaml"),
               *(part for setting in settings for part in ("--set", setting))]
    environment = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(PROJECT_ROOT), "JAX_PLATFORMS": "cpu",
                   "MLFLOW_TRACKING_URI": tracking_uri, "PIPELINE_QUIET": "1"}
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)


def test_train_and_evaluate_on_jax_log_a_model_that_scores_the_same_under_tensorflow(prepared_config, tmp_path):
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.ingest.outputs import read_split
    from pipeline.text.conventions import load_labels
    from pipeline.tracking import latest_training_run_id, setup_tracking

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trained = run_cli(prepared_config, "jax", "train", "--set", "training.epochs=2", tracking_uri=tracking_uri)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "Keras backend jax" in trained.stdout and "CPU" in trained.stdout
    evaluated = run_cli(prepared_config, "jax", "evaluate", tracking_uri=tracking_uri)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    config = prepared_config.replace(tracking={"tracking_uri": tracking_uri})
    setup_tracking(config.tracking)
    run = mlflow.get_run(latest_training_run_id(config.tracking))
    assert run.data.tags["keras_backend"] == "jax" and run.data.params["training.sparse_updates"] == "True"
    assert int(run.data.params["model.ngram_max"]) == 3
    folder = config.reports_dir / run.info.run_id
    names = load_labels(config.data_dir / "ingest")
    on_jax = from_probability_columns(pd.read_parquet(folder / "test_predictions.parquet"), names)
    test = read_split(config.data_dir / "ingest", "test")
    on_tensorflow = load_classifier(f"runs:/{run.info.run_id}/model").probabilities(test["text"].tolist())
    assert on_jax.shape == on_tensorflow.shape == (len(test), 2)
    np.testing.assert_allclose(on_tensorflow, on_jax, atol=1e-5)


@pytest.mark.parametrize("setting,message", [
    ("training.adversarial_epsilon=1.0", r"training.adversarial_epsilon=1 \(.*\) runs on Keras' TensorFlow backend "
                                         r"only, and this process runs on jax .*: set training.adversarial_epsilon=0"),
])
def test_what_only_tensorflow_does_is_one_error_naming_the_setting_off_tensorflow(prepared_config, monkeypatch,
                                                                                 setting, message):
    from pipeline.config import load_config
    from pipeline.core.errors import ConfigError
    from pipeline.runtime import backend
    from pipeline.stages import train

    monkeypatch.setattr(backend, "keras_backend", lambda: "jax")
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [
        f"paths.data_dir={prepared_config.data_dir}", f"paths.reports_dir={prepared_config.reports_dir}", setting])
    with pytest.raises(ConfigError, match=message):
        train.run(config)
    assert not (prepared_config.data_dir / "train").exists()  # refused before anything was written


def test_pretraining_export_and_multi_worker_are_refused_off_tensorflow(prepared_config, monkeypatch):
    from pipeline.core.errors import ConfigError
    from pipeline.runtime import backend
    from pipeline.stages import export, pretrain

    monkeypatch.setattr(backend, "keras_backend", lambda: "jax")
    with pytest.raises(ConfigError, match=r"masked-LM pretraining runs on Keras' TensorFlow backend only"):
        pretrain.run(prepared_config)
    with pytest.raises(ConfigError, match=r"make export \(a TensorFlow SavedModel\) runs on Keras' TensorFlow"):
        export.run(prepared_config)
    assert sorted(path.name for path in prepared_config.data_dir.iterdir()) == ["ingest", "tokenize"]
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}')
    with pytest.raises(ConfigError, match=r"multi-worker training \(TF_CONFIG\) .*: unset TF_CONFIG"):
        backend.check_training_settings(0.0)
    monkeypatch.setattr(backend, "keras_backend", lambda: "tensorflow")
    backend.check_training_settings(1.0)  # on TensorFlow nothing is refused
