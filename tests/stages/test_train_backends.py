"""What only TensorFlow does is one error naming the setting on another backend, before anything is written. Training
and evaluating on Keras' JAX backend, and the model scoring the same on TensorFlow, are tested through the GPU check's
dry run (``tests/experiments/test_gpu_check.py``), which runs them in a process without TensorFlow."""

from __future__ import annotations

import pytest

from tests.conftest import PROJECT_ROOT


@pytest.mark.parametrize(
    "setting,message",
    [
        (
            "training.adversarial_epsilon=1.0",
            r"training.adversarial_epsilon=1 \(.*\) runs on Keras' TensorFlow backend "
            r"only, and this process runs on jax .*: set training.adversarial_epsilon=0",
        ),
    ],
)
def test_what_only_tensorflow_does_is_one_error_naming_the_setting_off_tensorflow(
    prepared_config, monkeypatch, setting, message
):
    from pipeline.config import load_config
    from pipeline.core.errors import ConfigError
    from pipeline.runtime import backend
    from pipeline.stages import train

    monkeypatch.setattr(backend, "keras_backend", lambda: "jax")
    config = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [f"paths.data_dir={prepared_config.data_dir}", f"paths.reports_dir={prepared_config.reports_dir}", setting],
    )
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
