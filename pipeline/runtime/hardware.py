"""Where training runs: one device, several devices of one machine, or several machines.

- Several workers: ``TF_CONFIG`` (TensorFlow's cluster description, set on every worker) names
  more than one task, so training and pretraining run under ``MultiWorkerMirroredStrategy``.
  Every worker trains; only the chief (task ``chief``, else ``worker`` 0) logs to MLflow and
  writes the stage folder, the others work in a scratch folder that is removed at the end.
  Decisions read from a worker's own clock go through :func:`any_worker`. Keras's ``fit`` needs
  :func:`multi_worker_fit` around it there, and a cluster is refused on Keras releases it was not
  verified on (``VERIFIED_KERAS``).
- Several GPUs, or a CPU split into logical devices (``PIPELINE_CPU_DEVICES=N``, which is how the
  tests exercise the multi-device path on a CPU): ``MirroredStrategy`` over those devices.
- Otherwise TensorFlow's default strategy on the one device.

:func:`choose_hardware` adds the precision: ``mixed_float16`` on GPUs, ``mixed_bfloat16`` on CPUs with
bfloat16 units from a width where it pays off, else ``float32``.

Example, two workers on one machine (each in its own shell, same command)::

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
               "task": {"type": "worker", "index": 0}}' make train

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]},
               "task": {"type": "worker", "index": 1}}' make train
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import ConfigError, PipelineError
from pipeline.runtime.backend import uses_tensorflow

if TYPE_CHECKING:
    import tensorflow as tf

CPU_DEVICES_ENV = "PIPELINE_CPU_DEVICES"
TASK_TYPES = ("chief", "worker")


@dataclass(frozen=True)
class Cluster:
    """This process's place in a ``TF_CONFIG`` cluster."""

    workers: int  # training tasks (chief + workers)
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


@dataclass(frozen=True)
class WorkerRole:
    """What this process does in a stage that trains: alone, the cluster's chief, or another worker of it."""

    cluster: Cluster | None
    scratch: Path | None  # a worker other than the chief writes here, never into the stage folder

    @property
    def shard(self) -> tuple[int, int]:
        """(this worker's index, workers): the part of every epoch's batches it reads."""
        return (0, 1) if self.cluster is None else (self.cluster.worker_index, self.cluster.workers)


@contextlib.contextmanager
def worker_role(cluster: Cluster | None, stage: str) -> Iterator[WorkerRole]:
    """The set-up every training stage shares. In a cluster every worker must train (each step needs them all), the
    chief alone writes the stage folder and the MLflow run, the others work in a scratch folder removed at the end;
    the global dtype policy a stage sets is float32 again at the end, whatever happened."""
    scratch = None if cluster is None or cluster.is_chief else Path(tempfile.mkdtemp(prefix=f"{stage}-worker-"))
    try:
        yield WorkerRole(cluster, scratch)
    finally:
        import keras

        keras.mixed_precision.set_global_policy("float32")
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def cluster_from_env(environ: Mapping[str, str] = os.environ) -> Cluster | None:
    """The cluster ``TF_CONFIG`` describes, or None when it is unset or names a single task.

    The stages call it before they remove or write anything, so a malformed ``TF_CONFIG``, or a
    cluster on a Keras release :func:`multi_worker_fit` was not verified on, stops them there.
    """
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("cluster"), dict)
        or not isinstance(spec.get("task"), dict)
    ):
        raise ConfigError(
            'TF_CONFIG needs "cluster" and "task" objects, e.g. {"cluster": {"worker": '
            '["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}'
        )
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
        raise ConfigError(
            f"TF_CONFIG task.index must be 0..{len(cluster[task_type]) - 1} for job {task_type!r}, got {index!r}"
        )
    workers = sum(len(cluster.get(job, [])) for job in TASK_TYPES)
    if workers < 2:
        return None
    require_verified_keras()
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
            raise PipelineError(
                f"{CPU_DEVICES_ENV}={wanted}: TensorFlow had already started in this process; "
                "set it before the first stage runs"
            ) from None
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
        return (
            tf.distribute.MirroredStrategy(devices=devices),
            f"{cpus} logical CPU devices (MirroredStrategy, {os.cpu_count()} cores)",
        )
    return tf.distribute.get_strategy(), "1 GPU" if gpus else f"CPU ({os.cpu_count()} cores)"


# --------------------------------------------------------------------------- Keras under MultiWorkerMirroredStrategy


# Keras 3.15's ``fit`` cannot run under MultiWorkerMirroredStrategy as shipped (keras-team/keras#20585), and
# no public API avoids the failing reduction of the input batch. The workaround below touches only the one
# model it is given, only inside ``with multi_worker_fit(...)``, and only on the Keras versions it was run on.
VERIFIED_KERAS = ("3.15",)  # major.minor releases multi_worker_fit was verified on (tests/runtime/test_hardware.py)


def keras_version() -> str:
    """The installed Keras release, from its package metadata (what ``pip show keras`` prints)."""
    try:
        return version("keras")
    except PackageNotFoundError:
        return "unknown"


def require_verified_keras() -> None:
    """Refuse multi-worker training on a Keras release :func:`multi_worker_fit` was not verified on."""
    installed = keras_version()
    if ".".join(installed.split(".")[:2]) not in VERIFIED_KERAS:
        raise PipelineError(
            f"multi-worker training (TF_CONFIG names several tasks) is verified on Keras "
            f"{', '.join(VERIFIED_KERAS)} only, and Keras {installed} is installed: pin "
            f"keras=={VERIFIED_KERAS[-1]}.* or train single-worker (unset TF_CONFIG)"
        )


def in_multi_worker_mode(strategy) -> bool:
    """Whether ``strategy`` is a MultiWorkerMirroredStrategy over a cluster of more than one task."""
    if not uses_tensorflow():  # nothing else runs under a tf.distribute strategy
        return False
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    spec = strategy.cluster_resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in spec.jobs if job in TASK_TYPES) > 1


# the model attributes multi_worker_fit replaces for one block, and the compiled steps it makes stale
_REPLACED = ("train_step", "test_step", "_maybe_symbolic_build")
_DERIVED = ("train_function", "test_function")
_ABSENT = object()


@contextlib.contextmanager
def multi_worker_fit(model, dataset, strategy):
    """Let ``model.fit`` / ``model.evaluate`` run inside the block under MultiWorkerMirroredStrategy.

    Every other strategy (one device, MirroredStrategy) gets a no-op: nothing checked, nothing touched.
    Under several workers, Keras 3.15 fails twice (keras-team/keras#20585), and for this ``model`` only:

    - ``fit`` builds the model from the input batch averaged across workers (a ``reduce`` of the token
      ids). The model, its optimizer and metrics are built here from this worker's first batch of
      ``dataset`` instead (the same variables), and the model's ``_maybe_symbolic_build`` skips.
    - Each step's scalar logs are averaged with ``reduce("MEAN", value, axis=0)``, which has no axis 0.
      The model's ``train_step`` and ``test_step`` return them as 1-element vectors, whose axis-0 mean
      over the workers is the scalar mean.

    On exit, also on an exception, the model's own attributes and compiled steps are back; no module
    is patched. Refused with a :class:`PipelineError` on a Keras release outside ``VERIFIED_KERAS``.
    """
    if not in_multi_worker_mode(strategy):
        yield
        return
    require_verified_keras()
    import tensorflow as tf

    saved = {name: vars(model).get(name, _ABSENT) for name in _REPLACED + _DERIVED}

    def scalars_as_vectors(step):
        def vector_logs_step(data):
            return tf.nest.map_structure(
                lambda value: tf.reshape(value, [1]) if tf.is_tensor(value) and value.shape.rank == 0 else value,
                step(data),
            )

        return vector_logs_step

    try:
        batch = next(iter(dataset))
        with strategy.scope():
            model._symbolic_build(data_batch=batch)
        model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
        model.train_step = scalars_as_vectors(model.train_step)
        model.test_step = scalars_as_vectors(model.test_step)
        model.train_function = model.test_function = None  # made again from the steps above
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                vars(model).pop(name, None)
            else:
                setattr(model, name, value)


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


def choose_hardware(precision: str, hidden_dim: int = 0) -> tuple[tf.distribute.Strategy, str, str]:
    """(distribution strategy, Keras dtype policy, a description to log).

    The strategy comes from :func:`choose_strategy`: several workers, devices or one device.
    """
    import tensorflow as tf

    strategy, device = choose_strategy()
    gpus = tf.config.list_physical_devices("GPU")
    if precision == "auto":
        # On a CPU with bfloat16 units, mixed_bfloat16 pays only where the matrix products dominate: slower
        # than float32 for the narrow default, faster from BFLOAT16_MIN_WIDTH (`make bench`: docs/throughput.md)
        if gpus:
            policy = "mixed_float16"
        elif hidden_dim >= BFLOAT16_MIN_WIDTH and cpu_has_bfloat16():
            policy = "mixed_bfloat16"
        else:
            policy = "float32"
    else:
        policy = precision
    return strategy, policy, device
