"""Where training runs: one device, several devices of one machine, or several machines.

- Several workers: ``TF_CONFIG`` (TensorFlow's cluster description, set on every worker) names
  more than one task, so training runs under ``MultiWorkerMirroredStrategy``. Every worker trains;
  only the chief (task ``chief``, else ``worker`` 0) logs to MLflow and writes the stage folder,
  the others work in a scratch folder that is removed at the end.
- Several GPUs, or a CPU split into logical devices (``PIPELINE_CPU_DEVICES=N``, which is how the
  tests exercise the multi-device path on a CPU): ``MirroredStrategy`` over those devices.
- Otherwise TensorFlow's default strategy on the one device.

Example, two workers on one machine (each in its own shell, same command)::

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}' make train
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 1}}' make train
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from pipeline.errors import ConfigError, PipelineError

CPU_DEVICES_ENV = "PIPELINE_CPU_DEVICES"
TASK_TYPES = ("chief", "worker")


@dataclass(frozen=True)
class Cluster:
    """This process's place in a ``TF_CONFIG`` cluster."""

    workers: int        # training tasks (chief + workers)
    task_type: str
    index: int
    has_chief_job: bool

    @property
    def worker_index(self) -> int:
        """This task's place among the training tasks (the chief job, when there is one, first)."""
        return self.index if self.task_type == "chief" or not self.has_chief_job else self.index + 1

    @property
    def is_chief(self) -> bool:
        return self.task_type == "chief" or (not self.has_chief_job and self.index == 0)

    def describe(self) -> str:
        return f"{self.workers} workers (MultiWorkerMirroredStrategy), this is {self.task_type} {self.index}"


def cluster_from_env(environ: Mapping[str, str] = os.environ) -> Cluster | None:
    """The cluster ``TF_CONFIG`` describes, or None when it is unset or names a single task."""
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) or not isinstance(spec.get("task"), dict):
        raise ConfigError('TF_CONFIG needs "cluster" and "task" objects, e.g. {"cluster": {"worker": '
                          '["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}')
    cluster, task = spec["cluster"], spec["task"]
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) and ":" in a for a in addresses):
            raise ConfigError(f"TF_CONFIG cluster.{job} must be a list of 'host:port' strings, got {addresses!r}")
    task_type, index = task.get("type"), task.get("index")
    if task_type not in TASK_TYPES:
        raise ConfigError(f"TF_CONFIG task.type must be one of {TASK_TYPES}, got {task_type!r}")
    if task_type not in cluster:
        raise ConfigError(f"TF_CONFIG task.type {task_type!r} is not a job of the cluster {sorted(cluster)}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[task_type]):
        raise ConfigError(f"TF_CONFIG task.index must be 0..{len(cluster[task_type]) - 1} for job {task_type!r}, "
                          f"got {index!r}")
    workers = sum(len(cluster.get(job, [])) for job in TASK_TYPES)
    if workers < 2:
        return None
    return Cluster(workers, task_type, index, "chief" in cluster)


def split_cpu() -> int:
    """Split the CPU into ``$PIPELINE_CPU_DEVICES`` logical devices (before TensorFlow starts); their count."""
    import tensorflow as tf

    text = os.environ.get(CPU_DEVICES_ENV, "").strip()
    if not text:
        return len(tf.config.list_logical_devices("CPU"))
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{CPU_DEVICES_ENV} must be a positive integer, got {text!r}")
    wanted = int(text)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
    except RuntimeError:  # TensorFlow already started in this process: keep what it has
        if len(tf.config.list_logical_devices("CPU")) != wanted:
            raise PipelineError(f"{CPU_DEVICES_ENV}={wanted}: TensorFlow had already started in this process; "
                                "set it before the first stage runs") from None
    return wanted


def choose_strategy():
    """(strategy, description) for this process."""
    import tensorflow as tf

    cluster = cluster_from_env()
    if cluster is not None:
        return tf.distribute.MultiWorkerMirroredStrategy(), cluster.describe()
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy(), f"{len(gpus)} GPUs (MirroredStrategy)"
    cpus = split_cpu() if not gpus else 1
    if cpus > 1:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        return (tf.distribute.MirroredStrategy(devices=devices),
                f"{cpus} logical CPU devices (MirroredStrategy, {os.cpu_count()} cores)")
    return tf.distribute.get_strategy(), "1 GPU" if gpus else f"CPU ({os.cpu_count()} cores)"
