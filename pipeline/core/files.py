"""File helpers shared by every stage: checksums, atomic writes and stage manifests (the file names: ``catalog``).

A stage writes its outputs into a staging folder next to ``data/<stage>/`` and swaps it
into place only when everything is written, so a crash or a bad input never leaves a
half-written stage folder behind. Each stage folder holds a ``manifest.json`` recording
the format version, config hash, input checksums and code version; a stage whose
manifest matches its current inputs and config does not run again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblib

from pipeline import __version__
from pipeline.core.catalog import MANIFEST_FORMAT_VERSION, MANIFEST_NAME
from pipeline.core.errors import MissingInputError


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes, read in chunks (``sha256``; ``md5`` for the canonical archive)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


def sha256_file(path: str | Path) -> str:
    return file_digest(path, "sha256")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def code_version() -> str:
    """Package version plus the git commit when the code runs from a checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def current_umask() -> int:
    """The process's umask, read from ``/proc/self/status`` where the kernel shows it (Linux 4.7+).

    Elsewhere ``os.umask`` is the only reader and it sets while it reads: the value in between is the
    strictest one, so a file another thread creates meanwhile is too private, never too open.
    """
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0o666`` less the umask. ``tempfile.mkstemp``
    makes its files ``0o600``, so a file written through one and renamed into place is chmod-ed to this."""
    return 0o666 & ~current_umask()


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place."""
    return atomic_replace(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_replace(path: str | Path, write) -> Path:
    """Call ``write(temporary_path)``, then rename the temporary file beside ``path`` onto it.

    The file gets the mode a plain ``open(path, "w")`` would give it (:func:`new_file_mode`), not
    ``mkstemp``'s ``0o600``: reports and stage outputs stay readable for whoever the umask allows.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, new_file_mode())
    finally:
        os.close(handle)
    try:
        write(tmp_name)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    return path


def atomic_dump(obj: Any, path: str | Path) -> Path:
    """``joblib.dump`` written atomically (a fitted scikit-learn model)."""
    return atomic_replace(path, lambda tmp: joblib.dump(obj, tmp))


def atomic_write_parquet(frame, path: str | Path) -> Path:
    return atomic_replace(path, lambda tmp: frame.to_parquet(tmp, index=False))


def atomic_write_json(path: str | Path, payload: Any) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def staged_directory(final_dir: str | Path) -> Iterator[Path]:
    """Yield an empty staging folder; on success it replaces ``final_dir``, on error it vanishes."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.staging-", dir=final_dir.parent))
    try:
        staging.chmod(0o777 & ~current_umask())  # mkdtemp's folder is 0o700; the stage folder gets mkdir's mode
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    backup = final_dir.with_name(f".{final_dir.name}.previous")
    shutil.rmtree(backup, ignore_errors=True)
    if final_dir.exists():
        os.replace(final_dir, backup)
    os.replace(staging, final_dir)
    shutil.rmtree(backup, ignore_errors=True)


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder``."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())


def read_manifest(stage_dir: str | Path) -> dict[str, Any] | None:
    path = Path(stage_dir) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def require_manifest(stage_dir: str | Path) -> dict[str, Any]:
    """The stage's manifest (:func:`read_manifest`); an error naming it where it is missing or unreadable."""
    manifest = read_manifest(stage_dir)
    if manifest is None:
        raise MissingInputError(f"no readable manifest at {Path(stage_dir) / MANIFEST_NAME}: rerun the stage")
    return manifest


def write_manifest(stage_dir: str | Path, manifest: dict) -> Path:
    return atomic_write_json(Path(stage_dir) / MANIFEST_NAME, manifest)


def build_manifest(stage: str, config_hash: str, inputs: dict[str, str], config: dict, **fields: Any) -> dict:
    return {
        "format_version": MANIFEST_FORMAT_VERSION,
        "stage": stage,
        "config_hash": config_hash,
        "inputs": inputs,
        "config": config,
        "code_version": code_version(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **fields,
    }


def is_up_to_date(stage_dir: str | Path, config_hash: str, inputs: dict[str, str], outputs: list[str]) -> bool:
    """True when the stage's manifest matches ``config_hash`` and ``inputs`` and all outputs exist."""
    manifest = read_manifest(stage_dir)
    if manifest is None or manifest.get("format_version") != MANIFEST_FORMAT_VERSION:
        return False
    if manifest.get("config_hash") != config_hash or manifest.get("inputs") != inputs:
        return False
    return all((Path(stage_dir) / name).exists() for name in outputs)


VOLATILE_MANIFEST_FIELDS = ("created_at", "code_version", "learn_seconds", "train_seconds")


def manifest_hash(stage_dir: str | Path) -> str:
    """Checksum of a stage's manifest content: what a downstream stage records as its input.

    Timestamps, durations and the code version are left out, so re-running a stage that
    produces the same data (``--force``, a new commit) does not make every later stage rerun.
    """
    manifest = read_manifest(stage_dir)
    if manifest is None:
        raise MissingInputError(f"no manifest at {Path(stage_dir) / MANIFEST_NAME}")
    stable = {k: v for k, v in manifest.items() if k not in VOLATILE_MANIFEST_FIELDS}
    return sha256_text(json.dumps(stable, sort_keys=True, default=str))
