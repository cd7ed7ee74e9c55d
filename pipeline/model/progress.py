"""What a training run shows while it trains: Keras' progress bar in a terminal, a line now and then elsewhere.

Keras' bar redraws itself with carriage returns. In a terminal that is what a user wants; in a log file, a CI job or
behind ``nohup`` it is thousands of redraws per epoch, and its per-epoch mode (``verbose=2``) is silent until an epoch
ends: an hour, for a pretrained encoder on a CPU. A quiet run (``QUIET=1``, ``PIPELINE_QUIET=1``, or output that is
not a terminal) gets Keras' one line per epoch plus :class:`ProgressLines`: at most one line a minute saying where
the epoch is and how long is left, in this epoch and in the fit.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

import keras
import mlflow

from pipeline.core.logs import duration

QUIET_ENV = "PIPELINE_QUIET"
LINE_EVERY_SECONDS = 60.0


def quiet_requested(environ=os.environ, stream: TextIO | None = None) -> bool:
    """Whether a fit shows lines rather than Keras' bar: ``PIPELINE_QUIET`` set (to anything but 0, false or no),
    or ``stream`` (stdout) not a terminal."""
    setting = environ.get(QUIET_ENV)
    if setting is not None:
        return setting.strip().lower() not in ("0", "false", "no")
    stream = sys.stdout if stream is None else stream
    return not (hasattr(stream, "isatty") and stream.isatty())


def time_left(seconds: float, done_steps: int, steps_per_epoch: int, epochs_left: int) -> tuple[float, float]:
    """Seconds left in this epoch and in the whole fit, at the pace so far (``seconds`` for ``done_steps``); the
    epochs after this one are assumed to take as long as this one will."""
    pace = seconds / max(done_steps, 1)
    in_epoch = pace * max(steps_per_epoch - done_steps, 0)
    return in_epoch, in_epoch + epochs_left * pace * steps_per_epoch


def progress_line(epoch: int, epochs: int, step: int, steps: int, seconds: float, prefix: str = "train") -> str:
    """``train: epoch 1/3, step 1,200/3,829 (31%), 20m05s elapsed in it, about 44m left (2h10m in all)``."""
    in_epoch, in_all = time_left(seconds, step, steps, epochs - epoch)
    line = (
        f"{prefix}: epoch {epoch}/{epochs}, step {step:,}/{steps:,} ({step / max(steps, 1):.0%}), "
        f"{duration(seconds)} elapsed in it, about {duration(in_epoch)} left"
    )
    return line + (f" ({duration(in_all)} in all)" if epoch < epochs else "")


class ProgressLines(keras.callbacks.Callback):
    """Prints :func:`progress_line` at most every ``every_seconds`` of an epoch (never after its last step: Keras'
    epoch line says that). ``clock`` and ``emit`` are for tests."""

    def __init__(
        self,
        steps_per_epoch: int,
        every_seconds: float = LINE_EVERY_SECONDS,
        prefix: str = "train",
        clock: Callable[[], float] = time.perf_counter,
        emit: Callable[[str], None] | None = None,
    ):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self.every_seconds = every_seconds
        self.prefix = prefix
        self.clock = clock
        self.emit = emit or (lambda line: print(line, flush=True))
        self._epoch = 0
        self._epochs = 1
        self._started = 0.0
        self._last_line = 0.0

    def on_train_begin(self, logs=None):
        self._epochs = int((self.params or {}).get("epochs") or 1)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1
        self._started = self._last_line = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        now = self.clock()
        if step >= self.steps_per_epoch or now - self._last_line < self.every_seconds:
            return
        self._last_line = now
        self.emit(
            progress_line(self._epoch, self._epochs, step, self.steps_per_epoch, now - self._started, self.prefix)
        )


def progress_callbacks(steps_per_epoch: int, quiet: bool | None = None) -> tuple[int, list[keras.callbacks.Callback]]:
    """Keras' ``verbose`` and the callbacks that go with it: the bar (1) in a terminal; else one line per epoch (2)
    and :class:`ProgressLines`."""
    if not (quiet_requested() if quiet is None else quiet):
        return 1, []
    return 2, [ProgressLines(steps_per_epoch, LINE_EVERY_SECONDS)]


class MLflowEpochLogger(keras.callbacks.Callback):
    """Logs Keras epoch metrics plus learning rate, epoch seconds and tokens per second."""

    def __init__(self, tokens_per_epoch: int):
        super().__init__()
        self.tokens_per_epoch = tokens_per_epoch
        self._started = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._started
        metrics = {name: float(value) for name, value in (logs or {}).items()}
        # With a schedule, Keras evaluates it at the optimizer's current step.
        metrics["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        metrics["epoch_seconds"] = seconds
        metrics["tokens_per_second"] = self.tokens_per_epoch / max(seconds, 1e-9)
        mlflow.log_metrics(metrics, step=epoch)


def log_fit_metrics(metrics: dict[str, float]) -> None:
    """A fit's summary metrics (its best epoch's, its seconds) on the active MLflow run."""
    mlflow.log_metrics(metrics)
