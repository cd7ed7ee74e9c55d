import json

import keras
import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.model.classifiers import load_keras_model
from pipeline.model.forward import predict_probabilities
from pipeline.stages import train
from pipeline.stages.train import fit_and_log as training
from pipeline.text.wordpiece import WordPieceTextTokenizer


def test_tiny_model_learns_separable_task(trained_run):
    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["best_val_accuracy"] > 0.9
    assert manifest["device"].startswith(("CPU", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs"))
    assert (run_dir / "model.keras").is_file() and (run_dir / "training_curves.png").stat().st_size > 1000


def test_run_is_tracked_in_mlflow(trained_run):
    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(manifest["mlflow_run_id"])
    assert run.data.params["model.pooling"] == "first_token"
    assert run.data.params["training.epochs"] == str(config.training.epochs)
    assert run.data.tags["pooling"] == "first_token"
    assert run.data.tags["config_hash"] == manifest["config_hash"]
    assert "tokenize_manifest" in run.data.tags and "ingest_manifest" in run.data.tags
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "epoch_seconds", "tokens_per_second"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == list(range(manifest["epochs_run"])), key
    learning_rates = [m.value for m in client.get_metric_history(run.info.run_id, "learning_rate")]
    assert all(0 <= rate < config.training.learning_rate for rate in learning_rates)  # logged after each epoch
    assert learning_rates[0] > 0
    assert learning_rates == sorted(learning_rates, reverse=True)  # cosine decay, no warm-up in smoke
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "plots/training_curves.png" in artifacts
    assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"imdb-train", "imdb-val"}


def test_pyfunc_model_scores_raw_strings(trained_run):
    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    pyfunc = mlflow.pyfunc.load_model(f"runs:/{manifest['mlflow_run_id']}/model")
    texts = ["A wonderful superb brilliant film, loved it.", "Awful, boring, the worst plot.", ""]
    scored = pyfunc.predict(pd.DataFrame({"text": texts}))
    assert list(scored.columns) == ["positive_probability", "predicted_label", "score_error"]
    assert scored["predicted_label"].tolist() == ["positive", "negative", ""]
    assert scored["score_error"].tolist() == ["", "", "missing or empty text"]
    assert scored["positive_probability"].iloc[2] is None
    direct = predict_probabilities(
        load_keras_model(run_dir / "model.keras"), WordPieceTextTokenizer.load(run_dir / "tokenizer"), texts[:2]
    )
    np.testing.assert_allclose(scored["positive_probability"].iloc[:2].astype(float), direct[:, 1], atol=1e-6)


def test_rerun_with_same_config_is_skipped(trained_run, capsys):
    config, run_dir = trained_run
    assert train.run(config) == run_dir
    assert "up to date" in capsys.readouterr().out


def test_requires_tokenize_output(smoke_config):
    with pytest.raises(FileNotFoundError, match="make tokenize"):
        train.run(smoke_config)


class CrashAfterEpoch(keras.callbacks.Callback):
    def __init__(self, epoch: int):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt(f"simulated kill after epoch {epoch}")


class RecordEpochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def test_killed_training_resumes_from_last_epoch(prepared_config, capsys):
    config = prepared_config.replace(training={"epochs": 3, "early_stopping_patience": 5})
    with pytest.raises(KeyboardInterrupt):
        training.train_model(config, extra_callbacks=[CrashAfterEpoch(0)])
    recorder = RecordEpochs()
    run_dir = training.train_model(config, extra_callbacks=[recorder]).run_dir
    assert recorder.epochs == [1, 2]  # did not start over
    assert "resuming MLflow run" in capsys.readouterr().out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    client = mlflow.tracking.MlflowClient()
    assert [m.step for m in client.get_metric_history(manifest["mlflow_run_id"], "loss")] == [0, 1, 2]
    assert client.get_run(manifest["mlflow_run_id"]).info.status == "FINISHED"
    assert not (run_dir / "backup").exists()


def test_a_quiet_run_prints_where_each_epoch_is_and_the_time_left(prepared_config, capsys, monkeypatch):
    monkeypatch.setenv("PIPELINE_QUIET", "1")
    monkeypatch.setattr("pipeline.model.progress.LINE_EVERY_SECONDS", 0.0)  # a line after every step but the last
    training.train_model(prepared_config.replace(training={"epochs": 2, "early_stopping_patience": 5}))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: epoch ")]
    assert lines, "no progress line"
    assert {line.split(",")[0] for line in lines} == {"train: epoch 1/2", "train: epoch 2/2"}
    assert all(" elapsed in it, about " in line for line in lines)
    assert "in all)" in lines[0] and "in all)" not in lines[-1]  # the time left in the fit, while epochs remain


def test_mlflow_models_predict_cli_scores_a_csv_in_a_fresh_process(trained_run, tmp_path):
    """A new process has not imported pipeline.model.transformer: the pyfunc must bring what it needs."""
    import os
    import subprocess
    import sys

    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    reviews = tmp_path / "reviews.csv"
    pd.DataFrame({"text": ["Superb, wonderful and moving.", "Dreadful, dull, the worst."]}).to_csv(reviews, index=False)
    output = tmp_path / "predictions.json"
    env = {**os.environ, "MLFLOW_TRACKING_URI": config.tracking.tracking_uri}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "predict",
            "-m",
            f"runs:/{manifest['mlflow_run_id']}/model",
            "-i",
            str(reviews),
            "-t",
            "csv",
            "--env-manager",
            "local",
            "-o",
            str(output),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    predictions = json.loads(output.read_text())["predictions"]
    assert [row["predicted_label"] for row in predictions] == ["positive", "negative"]


def test_max_train_samples_draws_from_the_whole_split_not_its_head():
    from pipeline.runtime.datasets import subsample

    labels = np.repeat([0, 1], 500)  # ordered by label, as IMDB's train split is
    keep = subsample(len(labels), 100, seed=3)
    assert len(keep) == 100 == len(set(keep.tolist())) and (np.diff(keep) > 0).all()
    assert 30 < labels[keep].sum() < 70  # both classes, not the first 100 rows (all 0)
    assert (subsample(len(labels), 100, seed=3) == keep).all()
    assert (subsample(50, 100, seed=3) == np.arange(50)).all()


def test_running_out_of_device_memory_is_one_error_naming_the_batch_size(prepared_config):
    """A GPU's ResourceExhaustedError during fit becomes the user's setting to change (raised here by a callback:
    this CPU machine has no device memory to exhaust)."""
    import keras
    import tensorflow as tf

    from pipeline.core.errors import ConfigError
    from pipeline.stages.train.fit_and_log import train_model

    class OutOfMemory(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape [16, 32, 64]")

    with pytest.raises(
        ConfigError,
        match=r"out of memory training with training.batch_size=16 .* lower "
        r"training.batch_size",
    ):
        train_model(prepared_config.replace(model={"ngram_max": 1}), extra_callbacks=[OutOfMemory()])


def test_the_saved_model_holds_weights_not_optimizer_state(trained_run, tmp_path):
    """model.keras loads uncompiled: no optimizer state inside. The control: the same model saved compiled, after one
    step, carries its optimizer and is the larger file."""
    import numpy as np

    from pipeline.model.classifiers import load_keras_model
    from pipeline.model.fit import compile_model

    config, run_dir = trained_run
    saved = load_keras_model(run_dir / "model.keras")
    assert getattr(saved, "optimizer", None) is None
    compiled = compile_model(load_keras_model(run_dir / "model.keras"), config.training, False, steps_per_epoch=1)
    ids = np.load(config.data_dir / "tokenize" / "test_ids.npy")[:8]
    compiled.train_on_batch(ids, np.zeros(len(ids), "int32"))  # builds the optimizer's variables
    compiled.save(tmp_path / "compiled.keras")
    assert getattr(load_keras_model(tmp_path / "compiled.keras"), "optimizer", None) is not None
    assert (run_dir / "model.keras").stat().st_size < (tmp_path / "compiled.keras").stat().st_size


def test_a_run_trained_to_read_windows_scores_and_evaluates_long_reviews_by_them(prepared_config):
    """model.long_reviews=windows: the run's own model_settings.json says so (its tokenizer files hold no model
    setting), and its logged model and its evaluation read a review longer than the limit through its windows
    (training itself reads the same head+tail rows)."""
    from pipeline.core.predictions import pool_windows
    from pipeline.model.classifiers import SentimentClassifier, load_classifier
    from pipeline.stages.evaluate.scorecard import evaluate_run

    config = prepared_config.replace(model={"long_reviews": "windows"}, training={"epochs": 1})
    run_dir = training.train_model(config).run_dir
    assert json.loads((run_dir / "model_settings.json").read_text()) == {"long_reviews": "windows"}
    assert "long_reviews" not in json.loads((run_dir / "tokenizer" / "tokenizer.json").read_text())
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    logged = load_classifier(f"runs:/{run_id}/model")
    assert logged.reads_windows and logged.settings == {"long_reviews": "windows"}
    truncating = SentimentClassifier.from_paths(run_dir / "model.keras", config.data_dir / "tokenize")
    test = pd.read_parquet(config.data_dir / "ingest" / "test.parquet")
    texts = test["text"].tolist()
    ids, owner = logged.text_tokenizer.encode_windows(texts)
    long = np.flatnonzero(np.bincount(owner) > 1)
    assert len(long) > 0  # the generated test reviews include some longer than the 32-token limit
    expected = pool_windows(logged.model.predict(ids, verbose=0), owner)
    evaluated_run = evaluate_run(config, run_id)
    evaluated = evaluated_run.predictions("test")["positive_probability"].to_numpy()
    np.testing.assert_allclose(evaluated, expected[:, 1], atol=1e-5)
    assert np.abs(evaluated[long] - truncating.probabilities([texts[i] for i in long])[:, 1]).max() > 1e-4


def test_the_logged_model_names_the_exact_version_of_every_requirement(trained_run):
    """Its requirements.txt pins every package at the version it was logged with (a virtualenv or conda
    environment built from it is this one); the pins come from this environment's installed distributions."""
    from importlib.metadata import version

    from pipeline.model.logged_model import MODEL_DISTRIBUTIONS

    config, run_dir = trained_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    path = mlflow.artifacts.download_artifacts(f"runs:/{manifest['mlflow_run_id']}/model/requirements.txt")
    lines = [line.strip() for line in open(path) if line.strip() and not line.startswith("#")]
    pins = dict(line.split("==", 1) for line in lines if "==" in line)
    assert len(pins) == len(lines), lines  # every requirement carries its exact version
    assert {name: pins.get(name) for name in MODEL_DISTRIBUTIONS} == {
        name: version(name) for name in MODEL_DISTRIBUTIONS
    }
