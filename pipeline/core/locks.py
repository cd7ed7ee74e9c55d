"""One writer at a time per data folder: a stage that writes takes an exclusive lock on ``<data_dir>/.pipeline.lock``
(``flock``: the kernel releases it when the process ends, however it ends, so a killed build leaves no stale lock).

A second writer on the same folder stops at once with one ``error:`` line naming the command that holds it; readers
(``make score``, ``make serve``, ``make ui``) take no lock and keep working beside a build. ``make clean`` asks for the
same lock (``flock -n``), so it cannot delete a folder a stage is writing. The holder's line is erased when its block
ends; a line still there when the next writer takes the lock is a command that was killed, and :func:`writer_lock`
says when it started (so the MLflow runs it left running can be marked failed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import PipelineError

LOCK_FILE = ".pipeline.lock"


class BusyError(PipelineError):
    """Another command is writing the same data folder."""


@contextlib.contextmanager
def writer_lock(data_dir: str | Path, command: str) -> Iterator[float | None]:
    """Hold the data folder's lock for the block; :class:`BusyError` naming the holder's command when another process
    holds it. The lock file keeps the holder's command, process id and start time for that message. Yields the start
    time (seconds since the epoch) of a killed previous holder, or None."""
    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    handle = path.open("a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = (handle.read().strip() or "another command").splitlines()[0]
            raise BusyError(
                f"{holder} is writing {folder}/; wait for it to finish (or stop it), then run this again"
            ) from None
        handle.seek(0)
        killed = killed_since(handle.read())
        handle.seek(0)
        handle.truncate()
        now = time.time()
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        handle.write(f"`{command}` (process {os.getpid()}, started {started})\n{now!r}\n")
        handle.flush()
        try:
            yield killed
        finally:  # finished, or stopped by an exception (Ctrl-C included) it saw: its runs ended as MLflow says
            handle.seek(0)
            handle.truncate()
    finally:
        handle.close()  # closing the file releases the lock


def killed_since(previous: str) -> float | None:
    """The start time a killed holder left in the lock file (its second line), or None when it ended cleanly."""
    lines = previous.splitlines()
    if len(lines) < 2:
        return None
    try:
        return float(lines[1])
    except ValueError:
        return None
