"""Training on several devices and several workers, on this machine's CPU.

MirroredStrategy runs on the CPU split into 2 logical devices; MultiWorkerMirroredStrategy runs as
two worker processes on 127.0.0.1 ports. Both train the smoke model for one epoch. The Keras
workaround that multi-worker fitting needs is checked in-process: scoped to one model and one block,
and refused on Keras releases it was not verified on.
"""

import json
import os
import re
import subprocess
import sys

import mlflow
import numpy as np
import pytest

from pipeline.__main__ import main as cli_main
from pipeline.config import load_config
from pipeline.core.errors import ConfigError, PipelineError
from pipeline.runtime import hardware
from pipeline.runtime.datasets import make_dataset
from pipeline.runtime.hardware import Cluster, cluster_from_env, multi_worker_fit
from pipeline.runtime.local_http import free_port
from pipeline.stages import ingest, tokenize
from tests.conftest import PROJECT_ROOT, inside, make_archive, write_imdb_tree

SMOKE = str(PROJECT_ROOT / "configs" / "smoke.yaml")


def tf_config(ports, index, task_type="worker", chief=None) -> str:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    if chief:
        cluster["chief"] = [f"127.0.0.1:{chief}"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_cluster_is_read_from_tf_config():
    assert cluster_from_env({}) is None
    assert cluster_from_env({"TF_CONFIG": tf_config([1], 0)}) is None  # one task: no cluster
    worker1 = cluster_from_env({"TF_CONFIG": tf_config([1, 2], 1)})
    assert worker1 == Cluster(2, "worker", 1, False) and not worker1.is_chief and worker1.worker_index == 1
    assert cluster_from_env({"TF_CONFIG": tf_config([1, 2], 0)}).is_chief
    with_chief = cluster_from_env({"TF_CONFIG": tf_config([1, 2], 0, chief=3)})
    assert with_chief.workers == 3 and not with_chief.is_chief and with_chief.worker_index == 1
    chief = cluster_from_env({"TF_CONFIG": tf_config([1, 2], 0, "chief", chief=3)})
    assert chief.is_chief and chief.worker_index == 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "TF_CONFIG is not valid JSON"),
        ('{"cluster": {"worker": ["a:1", "b:2"]}}', 'needs "cluster" and "task"'),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}', "task.index must be 0..1"),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "ps", "index": 0}}', "task.type must be one of"),
        ('{"cluster": {"worker": ["a", "b:2"]}, "task": {"type": "worker", "index": 0}}', "'host:port' strings"),
    ],
)
def test_malformed_tf_config_is_named(text, message):
    with pytest.raises(ConfigError, match=message):
        cluster_from_env({"TF_CONFIG": text})


def test_shards_split_every_global_batch_and_keep_the_step_count():
    ids = np.zeros((37, 8), dtype=np.int32)
    ids[:, 0] = np.arange(37) + 1  # first token: the row's identity
    ids[np.arange(37), 1 + np.arange(37) % 7] = 9
    labels = np.arange(37) % 2
    epochs = []
    for index in (0, 1):
        batches = list(make_dataset(ids, labels, batch_size=8, shuffle_seed=3, shard=(index, 2)))
        epochs.append(batches)
    assert len(epochs[0]) == len(epochs[1]) == 5  # ceil(37 / 8) global steps on every worker
    seen = np.concatenate([b[0][:, 0].numpy() for shard in epochs for b in shard])
    assert sorted(set(seen.tolist())) == list(range(1, 38))  # every example, once
    assert len(seen) == 37  # ... the last global batch of 5 rows is split 3 + 2
    # a last global batch of one row is repeated rather than leave a worker without a batch
    shards = [list(make_dataset(ids[:33], labels[:33], batch_size=8, shuffle_seed=3, shard=(i, 2))) for i in (0, 1)]
    assert [len(s) for s in shards] == [5, 5] and all(len(b[1]) >= 1 for s in shards for b in s)
    for shard in epochs:
        for x, y in shard:
            assert (y.numpy() == (x[:, 0].numpy() - 1) % 2).all()  # labels travel with their rows


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    write_imdb_tree(root / "source", per_class={"train": 40, "test": 10}, seed=5, unlabeled=80)
    archive = make_archive(root / "source", root / "archive.tar.gz")
    overrides = [
        f"data.archive={archive}",
        f"paths.data_dir={root / 'data'}",
        f"paths.reports_dir={root / 'reports'}",
        f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
        "training.epochs=1",
    ]
    config = load_config(SMOKE, overrides)
    with inside(root):
        ingest.run(config)
        tokenize.run(config)
    return root, config, overrides


def train_command(overrides, stage: str = "train") -> list[str]:
    args = [sys.executable, "-m", "pipeline", stage, "--config", SMOKE]
    for item in overrides:
        args += ["--set", item]
    return args


def worker_environment(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PIPELINE_CPU_DEVICES")}
    return {**env, "PIPELINE_QUIET": "1", "PYTHONPATH": str(PROJECT_ROOT), **extra}


def train_runs(config, stage: str = "train") -> list:
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    return mlflow.search_runs(
        experiment_names=[config.tracking.experiment_name],
        output_format="list",
        filter_string=f"tags.pipeline_stage = '{stage}'",
    )


def run_two_workers(command, root, tmp_path) -> list[str]:
    ports = [free_port(), free_port()]
    workers = [
        subprocess.Popen(
            command,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=worker_environment(TF_CONFIG=tf_config(ports, index), TMPDIR=str(tmp_path)),
        )
        for index in (0, 1)
    ]
    try:
        outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    return outputs


def test_mirrored_strategy_on_two_logical_cpus(tokenized):
    root, config, overrides = tokenized
    done = subprocess.run(
        train_command(overrides + ["training.seed=11"]),
        cwd=root,
        capture_output=True,
        text=True,
        env=worker_environment(PIPELINE_CPU_DEVICES="2"),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "using 2 logical CPU devices (MirroredStrategy" in done.stdout
    run = next(r for r in train_runs(config) if r.data.params["training.seed"] == "11")
    assert run.data.params["device"].startswith("2 logical CPU devices") and "best_val_accuracy" in run.data.metrics


def test_two_workers_train_one_run_and_leave_no_scratch(tokenized, tmp_path):
    root, config, overrides = tokenized
    before = len(train_runs(config))
    outputs = run_two_workers(train_command(overrides + ["training.seed=12"]), root, tmp_path)
    assert "2 workers (MultiWorkerMirroredStrategy), this is worker 0" in outputs[0]
    assert "this is worker 1: trained 1 epochs with the chief" in outputs[1]
    runs = train_runs(config)
    assert len(runs) == before + 1  # only the chief logs
    run = next(r for r in runs if r.data.params["training.seed"] == "12")
    assert run.data.params["device"].startswith("2 workers (MultiWorkerMirroredStrategy)")
    assert not list(tmp_path.glob("train-worker-*"))  # the other worker's scratch folder is gone
    # both workers saw the same averaged metrics: the epoch line is identical
    epoch_lines = [
        next(line for line in out.splitlines() if "val_accuracy" in line and "/step" in line) for out in outputs
    ]
    assert epoch_lines[0].split("- accuracy")[1] == epoch_lines[1].split("- accuracy")[1]


def test_two_workers_pretrain_to_one_agreed_time_budget(tokenized, tmp_path):
    """A minutes budget, read from each worker's own clock, still stops both workers at the same step."""
    root, config, overrides = tokenized
    budget = [
        "pretrain.max_steps=null",
        "pretrain.max_minutes=0.1",
        "pretrain.log_every_steps=4",
        "pretrain.snapshot_minutes=[0.02]",
    ]
    outputs = run_two_workers(train_command(overrides + budget, "pretrain"), root, tmp_path)
    assert "2 workers (MultiWorkerMirroredStrategy), this is worker 0" in outputs[0]
    chief_steps = re.search(r"; ([\d,]+) steps in [\d.]+ min of training on 2 workers", outputs[0])
    worker_steps = re.search(r"pretrain: 2 workers .*this is worker 1: ([\d,]+) steps with the chief", outputs[1])
    assert chief_steps and worker_steps, outputs[0][-2000:] + outputs[1][-2000:]
    assert chief_steps.group(1) == worker_steps.group(1) and int(chief_steps.group(1)) % 4 == 0
    runs = train_runs(config, "pretrain")
    assert len(runs) == 1 and runs[0].data.params["device"].startswith("2 workers")
    out_dir = config.data_dir / "pretrain"
    spec = json.loads((out_dir / "backbone.json").read_text())
    assert spec["mlflow_run_id"] == runs[0].info.run_id and spec["steps"] == int(chief_steps.group(1))
    assert (out_dir / "snapshots" / "0.02min" / "backbone.weights.npz").is_file()
    assert not list(tmp_path.glob("pretrain-worker-*"))  # the other worker's scratch folder is gone
    mlm_steps = [m.step for m in mlflow.tracking.MlflowClient().get_metric_history(runs[0].info.run_id, "mlm_loss")]
    assert mlm_steps == list(range(4, spec["steps"] + 1, 4))


def test_malformed_tf_config_stops_training_with_one_line(trained_run, monkeypatch, capsys):
    config, _ = trained_run
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker"}}')
    code = cli_main(
        [
            "train",
            "--config",
            SMOKE,
            "--set",
            f"paths.data_dir={config.data_dir}",
            "--set",
            f"tracking.tracking_uri={config.tracking.tracking_uri}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: TF_CONFIG task.index must be") and "\n" not in err


# --------------------------------------------------------------------------- the scoped Keras workaround

TWO_WORKERS = tf_config([1, 2], 0)


def tiny_model():
    import keras

    inputs = keras.Input((8,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(pooled))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def tiny_dataset():
    import tensorflow as tf

    ids = np.arange(64, dtype=np.int32).reshape(8, 8) % 20
    return tf.data.Dataset.from_tensor_slices((ids, np.arange(8) % 2)).batch(4)


class UntouchableDataset:
    """A dataset stand-in that fails the test if anything reads a batch from it."""

    def __iter__(self):
        raise AssertionError("the dataset was read")


def keras_state(model) -> dict:
    """What multi_worker_fit may change: the model's own attributes, and the Keras function it must never patch."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    names = ("train_step", "test_step", "_maybe_symbolic_build", "train_function", "test_function")
    return {
        **{name: vars(model).get(name, "absent") for name in names},
        "trainer.reduce_per_replica": tf_trainer.reduce_per_replica,
    }


@pytest.fixture
def as_multi_worker(monkeypatch):
    """Every strategy counts as a multi-worker one (a real cluster needs two processes: see the tests above)."""
    monkeypatch.setattr(hardware, "in_multi_worker_mode", lambda strategy: True)


def test_multi_worker_fit_changes_one_model_inside_the_block_only(as_multi_worker):
    import tensorflow as tf

    model, strategy = tiny_model(), tf.distribute.get_strategy()
    original_step, before = model.train_step, keras_state(model)
    with multi_worker_fit(model, tiny_dataset(), strategy):
        inside = keras_state(model)
        assert model.optimizer.built  # built here from a local batch, so fit has nothing to build
        logs = model.train_step(next(iter(tiny_dataset())))
        assert {k: v.shape for k, v in logs.items()} == {"loss": (1,), "accuracy": (1,)}  # averaged over axis 0
    # control: the comparison sees the workaround while it is in place ...
    assert inside["train_step"] != before["train_step"] and inside["_maybe_symbolic_build"] != "absent"
    assert inside["trainer.reduce_per_replica"] is before["trainer.reduce_per_replica"]  # ... but no module patch
    assert keras_state(model) == before and model.train_step == original_step
    assert {k: v.shape for k, v in model.train_step(next(iter(tiny_dataset()))).items()} == {"loss": (), "accuracy": ()}


def test_multi_worker_fit_restores_the_model_after_an_exception(as_multi_worker):
    import tensorflow as tf

    model = tiny_model()
    before = keras_state(model)
    with pytest.raises(KeyError, match="inside the block"):
        with multi_worker_fit(model, tiny_dataset(), tf.distribute.get_strategy()):
            assert keras_state(model) != before  # control: changed inside
            raise KeyError("inside the block")
    assert keras_state(model) == before


@pytest.mark.parametrize(
    "version, verified",
    [("3.15.1", True), ("3.15.0rc1", True), ("3.16.0", False), ("3.1.5", False), ("4.15.0", False), ("unknown", False)],
)
def test_an_unverified_keras_is_refused_with_one_line_naming_it(monkeypatch, as_multi_worker, version, verified):
    import tensorflow as tf

    monkeypatch.setattr(hardware, "keras_version", lambda: version)
    model = tiny_model()
    before = keras_state(model)
    if verified:  # control: the same calls pass on a verified release
        assert cluster_from_env({"TF_CONFIG": TWO_WORKERS}).workers == 2
        return
    with pytest.raises(PipelineError) as refused:
        cluster_from_env({"TF_CONFIG": TWO_WORKERS})
    message = str(refused.value)
    assert f"Keras {version} is installed" in message and "verified on Keras 3.15 only" in message
    assert "pin keras==3.15.*" in message and "unset TF_CONFIG" in message and "\n" not in message
    with pytest.raises(PipelineError, match=f"Keras {re.escape(version)} is installed"):
        with multi_worker_fit(model, UntouchableDataset(), tf.distribute.get_strategy()):
            pytest.fail("the block ran")
    assert keras_state(model) == before
    assert cluster_from_env({"TF_CONFIG": tf_config([1], 0)}) is None  # one task: no check


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_single_process_strategies_never_enter_the_workaround(monkeypatch, strategy_name):
    import tensorflow as tf

    strategy = (
        tf.distribute.get_strategy()
        if strategy_name == "default"
        else tf.distribute.MirroredStrategy(devices=["/cpu:0"])
    )
    monkeypatch.setattr(hardware, "keras_version", lambda: "0.1.0")  # would be refused if it were checked
    assert not hardware.in_multi_worker_mode(strategy)
    with strategy.scope():
        model = tiny_model()
    before = keras_state(model)
    with multi_worker_fit(model, UntouchableDataset(), strategy):
        assert keras_state(model) == before
    assert keras_state(model) == before


@pytest.mark.parametrize("stage", ["train", "pretrain"])
def test_an_unverified_keras_stops_a_cluster_before_anything_is_removed(trained_run, monkeypatch, capsys, stage):
    config, _ = trained_run
    monkeypatch.setattr(hardware, "keras_version", lambda: "3.99.0")
    monkeypatch.setenv("TF_CONFIG", TWO_WORKERS)
    files = {p: p.stat().st_mtime_ns for p in config.data_dir.rglob("*")}
    code = cli_main(
        [
            stage,
            "--config",
            SMOKE,
            "--set",
            f"paths.data_dir={config.data_dir}",
            "--set",
            f"tracking.tracking_uri={config.tracking.tracking_uri}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: multi-worker training") and "Keras 3.99.0" in err and "\n" not in err
    assert {p: p.stat().st_mtime_ns for p in config.data_dir.rglob("*")} == files
