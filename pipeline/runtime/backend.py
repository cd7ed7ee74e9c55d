"""Which Keras backend runs the model stages (``KERAS_BACKEND``: TensorFlow by default, JAX where a GPU has no
TensorFlow), the devices it sees, and the one error for what only TensorFlow does.

TensorFlow stays the tokenizers' engine (tf-text), the exported SavedModel's and masked-LM pretraining's; training,
evaluation and scoring run on either backend. Nothing here imports TensorFlow unless the backend is TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Protocol

from pipeline.core.errors import ConfigError

TENSORFLOW = "tensorflow"


def keras_backend() -> str:
    """The backend Keras runs on in this process (``KERAS_BACKEND``, else ``~/.keras/keras.json``)."""
    import keras

    return keras.backend.backend()


def uses_tensorflow() -> bool:
    return keras_backend() == TENSORFLOW


def require_tensorflow(what: str, how_to_avoid: str) -> None:
    """Refuse ``what`` (a setting or a step, named as the user writes it) on any other backend, in one error."""
    backend = keras_backend()
    if backend != TENSORFLOW:
        raise ConfigError(
            f"{what} runs on Keras' TensorFlow backend only, and this process runs on {backend} "
            f"(KERAS_BACKEND={os.environ.get('KERAS_BACKEND', backend)}): {how_to_avoid}, or unset "
            "BACKEND / KERAS_BACKEND"
        )


def check_training_settings(adversarial_epsilon: float) -> None:
    """What training cannot do off TensorFlow, refused before anything is built or written."""
    if adversarial_epsilon:
        require_tensorflow(
            f"training.adversarial_epsilon={adversarial_epsilon:g} (a second gradient inside the training step)",
            "set training.adversarial_epsilon=0",
        )
    if os.environ.get("TF_CONFIG", "").strip():
        require_tensorflow("multi-worker training (TF_CONFIG)", "unset TF_CONFIG to train on this machine's devices")
    if os.environ.get("PIPELINE_CPU_DEVICES", "").strip():
        require_tensorflow("PIPELINE_CPU_DEVICES (logical CPU devices)", "unset PIPELINE_CPU_DEVICES")


class DistributionStrategy(Protocol):
    """What training uses of a distribution strategy: a ``tf.distribute.Strategy``, or :class:`OneProgram`."""

    @property
    def num_replicas_in_sync(self) -> int: ...

    def scope(self) -> contextlib.AbstractContextManager: ...


@dataclass(frozen=True)
class OneProgram:
    """What training needs of a distribution strategy off TensorFlow: Keras' JAX backend runs one program over the
    devices it is given (``keras.distribution``), so there is nothing to enter and one replica to count."""

    num_replicas_in_sync: int = 1

    def scope(self):
        return contextlib.nullcontext()


def jax_accelerators() -> list:
    """The GPUs (or TPUs) JAX sees; empty on a CPU."""
    import jax

    return [device for device in jax.devices() if device.platform != "cpu"]


def choose_jax_hardware(precision: str) -> tuple[OneProgram, str, str]:
    """(strategy stand-in, Keras dtype policy, description) under JAX: every GPU JAX sees, data-parallel when there
    are several (``keras.distribution.DataParallel``); ``auto`` precision is ``mixed_bfloat16`` on a GPU (no loss
    scaling, the natural choice on Ampere and later), float32 on a CPU."""
    import keras

    accelerators = jax_accelerators()
    if len(accelerators) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=accelerators))
    if accelerators:
        kinds = sorted({getattr(device, "device_kind", device.platform) for device in accelerators})
        parallel = ", data-parallel" if len(accelerators) > 1 else ""
        description = f"{len(accelerators)} GPU ({', '.join(kinds)}; JAX{parallel})"
    else:
        description = f"CPU ({os.cpu_count()} cores, JAX)"
    policy = precision if precision != "auto" else ("mixed_bfloat16" if accelerators else "float32")
    return OneProgram(), policy, description


def device_names() -> tuple[str, ...]:
    """Every device the backend sees, for the run's parameters."""
    if uses_tensorflow():
        import tensorflow as tf

        return tuple(d.name.replace("/physical_device:", "") for d in tf.config.list_logical_devices())
    import jax

    return tuple(f"{device.platform}:{device.id}" for device in jax.devices())


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is the device running out of memory (TensorFlow's or XLA's word for it)."""
    return type(error).__name__ == "ResourceExhaustedError" or "RESOURCE_EXHAUSTED" in str(error)[:500]
