"""Where training runs: one device, several devices of one machine, or several machines.

- Several workers: ``TF_CONFIG`` (TensorFlow's cluster description, set on every worker) names
  more than one task, so training and pretraining run under ``MultiWorkerMirroredStrategy``.
  Every worker trains; only the chief (task ``chief``, else ``worker`` 0) logs to MLflow and
  writes the stage folder, the others work in a scratch folder that is removed at the end.
  Decisions read from a worker's own clock go through :func:`any_worker`.
- Several GPUs, or a CPU split into logical devices (``PIPELINE_CPU_DEVICES=N``, which is how the
  tests exercise the multi-device path on a CPU): ``MirroredStrategy`` over those devices.
- Otherwise TensorFlow's default strategy on the one device.

:func:`choose_hardware` adds the precision: ``mixed_float16`` on GPUs, ``mixed_bfloat16`` on CPUs with
bfloat16 units from a width where it pays off, else ``float32``.

Example, two workers on one machine (each in its own shell, same command)::

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}' make train
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 1}}' make train
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from pipeline.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    import tensorflow as tf

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


# --------------------------------------------------------------------------- Keras under MultiWorkerMirroredStrategy


def build_before_multi_worker_fit(model, dataset, strategy) -> None:
    """Build the model, optimizer and metrics from a local batch, then let ``fit`` skip its own build.

    Keras 3.15's ``fit`` builds them from a batch it averages across the workers (a collective
    ``reduce`` of the input ids), which fails under ``MultiWorkerMirroredStrategy``
    (keras-team/keras#20585). Building from this worker's first batch of ``dataset`` (a plain
    ``(x, y)`` or ``(x, y, sample_weight)`` batch, ``x`` a tensor or a dict) creates the same variables.
    """
    batch = next(iter(dataset))
    with strategy.scope():
        model._symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    patch_multi_worker_mean()


def patch_multi_worker_mean() -> None:
    """Average a step's logged loss and metrics over the workers as a scalar.

    Keras 3.15 averages them with ``strategy.reduce("MEAN", value, axis=0)``, which fails for the
    scalars a step returns under ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585); the
    mean over workers of a scalar is ``reduce("MEAN", value, axis=None)``. Applied only when a
    cluster is configured; every other path keeps Keras's own function.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = getattr(tf_trainer.reduce_per_replica, "__wrapped__", tf_trainer.reduce_per_replica)

    def reduce_per_replica(values, strategy, reduction):
        multi_worker = tf_trainer._collective_all_reduce_multi_worker(strategy)
        if multi_worker and reduction in ("auto", "mean"):
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None) if len(getattr(v, "shape", ())) == 0
                else original(v, strategy, reduction), values)
        return original(values, strategy, reduction)

    reduce_per_replica.__wrapped__ = original
    tf_trainer.reduce_per_replica = reduce_per_replica


def already_sharded(dataset):
    """``dataset`` marked as this worker's share already, so ``tf.distribute`` does not shard it again."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def any_worker(strategy, flag: bool) -> bool:
    """Whether ``flag`` is true on any worker: every worker must call this at the same step.

    A decision made from each worker's own clock (a time budget) differs between workers; acting
    on it alone would leave the others waiting in the next step's collective for ever. The
    collective sum of the flags makes it one decision. With one worker it is ``flag``.
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return bool(flag)
    value = strategy.run(lambda: tf.constant(1.0 if flag else 0.0))
    return bool(strategy.reduce("SUM", value, axis=None).numpy() > 0)


BFLOAT16_MIN_WIDTH = 256  # on CPUs with bfloat16 units, mixed_bfloat16 pays off from this width (make bench)


def cpu_has_bfloat16() -> bool:
    """Whether this CPU has bfloat16 matrix units (AVX512_BF16 or AMX), from /proc/cpuinfo (Linux)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def choose_hardware(precision: str, hidden_dim: int = 0) -> tuple["tf.distribute.Strategy", str, str]:
    """(distribution strategy, Keras dtype policy, a description to log).

    The strategy comes from :func:`choose_strategy`: several workers, devices or one device.
    """
    import tensorflow as tf

    strategy, device = choose_strategy()
    gpus = tf.config.list_physical_devices("GPU")
    if precision == "auto":
        # Measured with `make bench` on this project's 2-core AVX512_BF16/AMX CPU: mixed_bfloat16 is
        # slower than float32 for the width-64 default (164 vs 148 ms per classifier step) and faster
        # from width 256 (1148 vs 1403 ms), where the matrix products dominate.
        if gpus:
            policy = "mixed_float16"
        elif hidden_dim >= BFLOAT16_MIN_WIDTH and cpu_has_bfloat16():
            policy = "mixed_bfloat16"
        else:
            policy = "float32"
    else:
        policy = precision
    return strategy, policy, device
