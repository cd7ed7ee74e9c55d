"""A quiet training run's progress lines: when they are shown, what they say, and a real fit that prints them."""

from __future__ import annotations

import io

import keras
import numpy as np
import pytest

from pipeline.model.progress import ProgressLines, progress_callbacks, progress_line, quiet_requested, time_left


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_follows_the_setting_and_else_whether_output_is_a_terminal():
    assert quiet_requested({}, _Terminal()) is False
    assert quiet_requested({}, io.StringIO()) is True  # a log file, CI, nohup
    assert quiet_requested({"PIPELINE_QUIET": "1"}, _Terminal()) is True
    assert quiet_requested({"PIPELINE_QUIET": "0"}, io.StringIO()) is False
    assert quiet_requested({"PIPELINE_QUIET": " False "}, io.StringIO()) is False


def test_a_terminal_gets_keras_bar_and_a_quiet_run_the_lines():
    assert progress_callbacks(10, quiet=False) == (1, [])
    verbose, callbacks = progress_callbacks(10, quiet=True)
    assert verbose == 2 and len(callbacks) == 1 and isinstance(callbacks[0], ProgressLines)
    assert callbacks[0].steps_per_epoch == 10


def test_time_left_is_the_pace_so_far_over_the_steps_and_epochs_left():
    in_epoch, in_all = time_left(seconds=100.0, done_steps=25, steps_per_epoch=100, epochs_left=2)
    assert in_epoch == pytest.approx(300.0)  # 4 s a step, 75 steps left
    assert in_all == pytest.approx(300.0 + 2 * 400.0)
    assert time_left(5.0, 0, 10, 0) == (50.0, 50.0)  # no step done yet: no division by zero


def test_the_line_says_epoch_step_share_elapsed_and_time_left():
    line = progress_line(epoch=1, epochs=3, step=1200, steps=3829, seconds=1205.0)
    # 1.004 s a step: 2,629 steps left in this epoch (2,640 s), and 2 x 3,829 more after it (10,330 s in all)
    assert line == "train: epoch 1/3, step 1,200/3,829 (31%), 20m05s elapsed in it, about 44m00s left (2h52m in all)"
    last = progress_line(epoch=3, epochs=3, step=10, steps=20, seconds=30.0, prefix="compare")
    assert last == "compare: epoch 3/3, step 10/20 (50%), 0m30s elapsed in it, about 0m30s left"  # nothing after it


def test_at_most_one_line_per_interval_and_none_at_the_epochs_last_step():
    now = [0.0]
    lines: list[str] = []
    callback = ProgressLines(steps_per_epoch=10, every_seconds=60.0, clock=lambda: now[0], emit=lines.append)
    callback.set_params({"epochs": 2})
    callback.on_train_begin()
    callback.on_epoch_begin(0)
    for batch in range(10):  # 25 s a step: lines after steps 3 (75 s), 6 (150 s) and 9 (225 s); step 10 ends the epoch
        now[0] += 25.0
        callback.on_train_batch_end(batch)
    assert [line.split(", ")[1] for line in lines] == ["step 3/10 (30%)", "step 6/10 (60%)", "step 9/10 (90%)"]
    assert lines[0].startswith("train: epoch 1/2, ") and lines[0].endswith("about 2m55s left (7m05s in all)")
    callback.on_epoch_begin(1)  # the clock restarts with the epoch
    now[0] += 61.0
    callback.on_train_batch_end(0)
    assert lines[-1] == "train: epoch 2/2, step 1/10 (10%), 1m01s elapsed in it, about 9m09s left"


def test_a_real_fit_prints_the_lines(capsys):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 2, 64)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    callback = ProgressLines(steps_per_epoch=8, every_seconds=0.0)  # every step but the epoch's last
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(", ")[:2] for line in lines] == (
        [["train: epoch 1/2", f"step {step}/8 ({step / 8:.0%})"] for step in range(1, 8)]
        + [["train: epoch 2/2", f"step {step}/8 ({step / 8:.0%})"] for step in range(1, 8)]
    )
