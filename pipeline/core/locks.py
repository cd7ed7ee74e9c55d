"""One writer at a time per data folder: a stage that writes takes an exclusive lock on ``<data_dir>/.pipeline.lock``
(``flock``: the kernel releases it when the process ends, however it ends, so a killed build leaves no stale lock).

A second writer on the same folder stops at once with one ``error:`` line naming the command that holds it; readers
(``make score``, ``make serve``, ``make ui``) take no lock and keep working beside a build. ``make clean`` asks for the
same lock (``flock -n``), so it cannot delete a folder a stage is writing.
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
def writer_lock(data_dir: str | Path, command: str) -> Iterator[Path]:
    """Hold the data folder's lock for the block; :class:`BusyError` naming the holder's command when another process
    holds it. The lock file keeps the holder's command, process id and start time for that message."""
    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    handle = path.open("a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another command"
            raise BusyError(
                f"{holder} is writing {folder}/; wait for it to finish (or stop it), then run this again"
            ) from None
        handle.seek(0)
        handle.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        handle.write(f"`{command}` (process {os.getpid()}, started {started})\n")
        handle.flush()
        yield path
    finally:
        handle.close()  # closing the file releases the lock
