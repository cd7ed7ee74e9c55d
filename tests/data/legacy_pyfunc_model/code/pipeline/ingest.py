"""Ingestion stage: IMDB archive (or the user's own tables) -> versioned Parquet splits.

Reads:  ``data.source: imdb``: an aclImdb ``.tar.gz`` or ``aclImdb/`` folder (``data.archive``,
        ``$IMDB_ARCHIVE``, ``data/raw/aclImdb_v1.tar.gz``, or the canonical download, in that
        order); ``data.source: table``: CSV/TSV/Parquet file(s) at ``data.path`` (see tables.py).
        Unlabeled reviews (``train/unsup``, for pretraining): ``data.unlabeled_archive`` or
        ``$IMDB_UNSUP_ARCHIVE`` when set, else the labeled archive's own ``train/unsup`` when it has one
        (the canonical archive does).
Writes: ``data/ingest/{train,val,test}.parquet`` (columns ``review_id``, ``text``, ``label``
        (class index), ``label_name``, ``rating``, ``source_file``), ``unlabeled.parquet`` (``text``,
        when there are unlabeled reviews), ``labels.json`` (class names, index order) and
        ``data/ingest/manifest.json``.

The archive is streamed member by member and never extracted, so no member path can
write anywhere; members whose paths would escape an extraction folder (``..``,
absolute paths, links, devices) are still rejected because such an archive is not
one we should trust. The validation split is a stratified, seeded fraction of train;
the test split is only ever read for final evaluation.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator

import pandas as pd
from sklearn.model_selection import train_test_split
from tqdm.auto import tqdm

from pipeline.artifacts import (
    build_manifest,
    file_digest,
    is_up_to_date,
    sha256_file,
    sha256_text,
    staged_directory,
    write_manifest,
)
from pipeline.config import Config
from pipeline.errors import InputError, MissingInputError
from pipeline.stages import stage_dir
from pipeline.tables import find_table_files, load_table_splits
from pipeline.text import LABELS_FILE, UNLABELED_FILE, clean_text, percentiles, save_labels

STAGE = "ingest"
ARCHIVE_ENV_VAR = "IMDB_ARCHIVE"
UNLABELED_ENV_VAR = "IMDB_UNSUP_ARCHIVE"
CANONICAL_ARCHIVE_NAME = "aclImdb_v1.tar.gz"
SPLIT_FILES = ("train.parquet", "val.parquet", "test.parquet")
COLUMNS = ("review_id", "text", "label", "label_name", "rating", "source_file")
IMDB_LABELS = ("negative", "positive")  # label 0 = neg folder, 1 = pos folder
CLASS_FOLDERS = ("train/pos", "train/neg", "test/pos", "test/neg")
LABELS = {"pos": 1, "neg": 0}

_MEMBER_RE = re.compile(r"^(?:aclImdb/)?(train|test)/(pos|neg)/([^/]+)$")
_FILE_NAME_RE = re.compile(r"^(\d+)_(\d+)\.txt$")
_MAX_REPORTED_NAMES = 10


# --------------------------------------------------------------------------- pure functions


def decode_review(data: bytes) -> tuple[str, bool]:
    """Decode UTF-8; undecodable bytes become U+FFFD. Returns (text, had_bad_bytes)."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), True


def parse_file_name(name: str) -> tuple[int, int] | None:
    """``"123_8.txt"`` -> ``(123, 8)``; None for names not of the ``<id>_<rating>.txt`` form."""
    match = _FILE_NAME_RE.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_member_path(name: str, source: str) -> None:
    """Raise ValueError for a member path that would land outside an extraction folder."""
    path = PurePosixPath(name)
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in path.parts:
        raise InputError(
            f"{source}: refusing archive member {name!r}: its path would escape the destination folder"
        )


@dataclass
class CollectReport:
    """What collecting reviews from a source found besides the reviews themselves."""

    skipped_names: list[str] = field(default_factory=list)
    skipped_count: int = 0
    decode_error_files: int = 0
    seen_folders: set[str] = field(default_factory=set)


def collect_reviews(members: Iterable[tuple[str, bytes | None]], source: str) -> tuple[pd.DataFrame, CollectReport]:
    """Turn ``(relative path, bytes)`` members into one row per review.

    ``bytes`` is None for folder entries. Files under ``{train,test}/{pos,neg}/`` whose
    names are not ``<id>_<rating>.txt`` are counted and reported, not fatal.
    """
    report = CollectReport()
    rows: list[tuple] = []
    for name, data in members:
        name = name.rstrip("/")
        folder = re.sub(r"^aclImdb/", "", name)
        if data is None:
            if folder in CLASS_FOLDERS:
                report.seen_folders.add(folder)
            continue
        match = _MEMBER_RE.match(name)
        if not match:
            continue
        split, polarity, file_name = match.groups()
        report.seen_folders.add(f"{split}/{polarity}")
        parsed = parse_file_name(file_name)
        if parsed is None:
            report.skipped_count += 1
            if len(report.skipped_names) < _MAX_REPORTED_NAMES:
                report.skipped_names.append(name)
            continue
        text, had_bad_bytes = decode_review(data)
        report.decode_error_files += had_bad_bytes
        review_id, rating = parsed
        rows.append((split, review_id, clean_text(text), LABELS[polarity], rating, f"{split}/{polarity}/{file_name}"))

    frame = pd.DataFrame(rows, columns=["split", "review_id", "text", "label", "rating", "source_file"])
    for folder in CLASS_FOLDERS:
        split, polarity = folder.split("/")
        has_rows = bool(((frame["split"] == split) & (frame["label"] == LABELS[polarity])).any())
        if has_rows:
            continue
        if folder in report.seen_folders:
            raise InputError(f"{source}: class folder {folder} holds no <id>_<rating>.txt review files")
        raise InputError(
            f"{source}: no {folder} folder; expected the aclImdb layout "
            "(aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt)"
        )
    frame = frame.sort_values(["split", "label", "review_id", "source_file"], kind="stable")
    return frame.reset_index(drop=True), report


def split_train_validation(train: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stratified, seeded split of ``train`` into (train, validation)."""
    fit, val = train_test_split(train, test_size=fraction, random_state=seed, stratify=train["label"])
    return fit.sort_index().reset_index(drop=True), val.sort_index().reset_index(drop=True)


def length_percentiles(texts: pd.Series) -> dict[str, float]:
    return percentiles(texts.str.split().str.len().to_numpy())


def duplicate_counts(train: pd.DataFrame, test: pd.DataFrame) -> dict[str, int]:
    """Exact duplicate texts: repeats within the original train split, and test texts also in train."""
    train_texts = set(train["text"])
    return {
        "within_train": int(train["text"].duplicated().sum()),
        "within_test": int(test["text"].duplicated().sum()),
        "test_rows_in_train": int(test["text"].isin(train_texts).sum()),
    }


# --------------------------------------------------------------------------- reading sources


def iter_archive(path: Path, wanted: re.Pattern = _MEMBER_RE) -> Iterator[tuple[str, bytes | None]]:
    """Stream ``(name, bytes)`` of members matching ``wanted`` (and folder entries) from a .tar.gz.

    Unsafe members are rejected wherever they are; errors name the archive. The gzip layer is
    Python's ``GzipFile``, which raises on a stream cut short: tarfile's own ``r|gz`` ends the
    iteration silently when the cut falls on a header, so a truncated archive would read as a
    smaller one.
    """
    try:
        with gzip.open(path, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                check_member_path(member.name, str(path))
                if member.issym() or member.islnk():
                    raise InputError(f"{path}: refusing archive member {member.name!r}: links are not allowed")
                if member.isdir():
                    yield member.name, None
                    continue
                if not member.isfile():
                    raise InputError(f"{path}: refusing archive member {member.name!r}: not a regular file")
                if not wanted.match(member.name):
                    continue
                handle = archive.extractfile(member)
                yield member.name, handle.read() if handle else b""
            while stream.read(1 << 20):  # the end-of-archive padding; reaching EOF checks the gzip trailer
                pass
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(f"{path}: not a readable .tar.gz archive (truncated or corrupt?): {exc}") from None


def iter_folder(root: Path) -> Iterator[tuple[str, bytes | None]]:
    """Walk an extracted ``aclImdb/`` folder in sorted order; links are rejected."""
    for folder in CLASS_FOLDERS:
        directory = root / folder
        if not directory.is_dir():
            continue
        yield folder, None
        for entry in sorted(directory.iterdir()):
            if entry.is_symlink():
                raise InputError(f"{entry}: refusing a symbolic link inside the dataset folder")
            if entry.is_file():
                yield f"{folder}/{entry.name}", entry.read_bytes()


_UNLABELED_RE = re.compile(r"^(?:aclImdb/)?train/unsup/[^/]+\.txt$")


def read_unlabeled_texts(path: Path, limit: int | None = None) -> list[str]:
    """Cleaned texts of ``train/unsup/*.txt`` from an aclImdb archive or folder (for pretraining)."""
    if path.is_dir():
        folder = dataset_root(path) / "train" / "unsup"
        if not folder.is_dir():
            raise MissingInputError(f"{path}: no train/unsup folder of unlabeled reviews")
        members = ((f.name, f.read_bytes()) for f in sorted(folder.iterdir()) if f.suffix == ".txt")
    elif path.is_file():
        members = iter_archive(path, wanted=_UNLABELED_RE)
    else:
        raise MissingInputError(f"unlabeled corpus not found: {path}")
    texts = []
    for _name, data in tqdm(members, desc=f"reading {path.name}", unit=" files", mininterval=1.0):
        if limit is not None and len(texts) >= limit:
            break
        if data is not None:
            texts.append(clean_text(decode_review(data)[0]))
    if not texts:
        raise InputError(f"{path}: holds no train/unsup/*.txt reviews")
    return texts


def folder_fingerprint(root: Path) -> str:
    """Cheap content fingerprint of a folder: relative names, sizes and modification times."""
    digest = hashlib.sha256()
    for folder in CLASS_FOLDERS:
        directory = root / folder
        if directory.is_dir():
            for entry in sorted(directory.iterdir()):
                stat = entry.lstat()
                digest.update(f"{folder}/{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def md5_file(path: Path) -> str:
    return file_digest(path, "md5")


def download_archive(url: str, md5: str, destination: Path) -> Path:
    """Download ``url`` to a temporary file with a progress bar, verify its md5, rename into place."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"downloading {destination.name}") as bar:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise MissingInputError(
            f"could not download the IMDB archive from {url} ({exc}). If this machine is offline, "
            f"point {ARCHIVE_ENV_VAR}=/path/to/{CANONICAL_ARCHIVE_NAME} (or an extracted aclImdb/ folder) "
            f"at a local copy, or pass --set data.archive=PATH, or place it at {destination}"
        ) from None
    actual = md5_file(partial)
    if actual != md5:
        partial.unlink(missing_ok=True)
        raise InputError(f"{url}: downloaded file has md5 {actual}, expected {md5}; nothing was kept")
    os.replace(partial, destination)
    return destination


def resolve_source(config: Config, environ: dict[str, str] | None = None) -> Path:
    """The dataset path by precedence: data.archive, $IMDB_ARCHIVE, data/raw/..., download."""
    environ = dict(os.environ) if environ is None else environ
    explicit = config.data.archive or environ.get(ARCHIVE_ENV_VAR)
    if explicit:
        path = Path(explicit).expanduser()
        origin = "data.archive" if config.data.archive else ARCHIVE_ENV_VAR
        if not path.exists():
            raise MissingInputError(f"IMDB archive not found: {path} (from {origin})")
        return path
    canonical = config.data_dir / "raw" / CANONICAL_ARCHIVE_NAME
    if canonical.exists():
        return canonical
    return download_archive(config.data.download_url, config.data.download_md5, canonical)


def verify_checksums(path: Path, config: Config, archive_sha256: str) -> None:
    expected = config.data.archive_sha256
    if expected and expected.lower() != archive_sha256:
        raise InputError(f"{path}: sha256 mismatch: expected {expected}, actual {archive_sha256}")
    canonical = config.data_dir / "raw" / CANONICAL_ARCHIVE_NAME
    if path.is_file() and path.resolve() == canonical.resolve():
        actual_md5 = md5_file(path)
        if actual_md5 != config.data.download_md5:
            raise InputError(
                f"{path}: md5 mismatch: expected {config.data.download_md5}, actual {actual_md5} "
                "(a partial or different download? delete it to download again)"
            )


def dataset_root(path: Path) -> Path:
    """For a folder source, accept either ``aclImdb/`` itself or a folder that contains it."""
    return path / "aclImdb" if (path / "aclImdb").is_dir() else path


# --------------------------------------------------------------------------- stage entry point


def resolve_unlabeled_source(config: Config, environ: dict[str, str] | None = None) -> Path | None:
    """The unlabeled reviews named by ``data.unlabeled_archive`` or ``$IMDB_UNSUP_ARCHIVE``; None when neither is set."""
    environ = dict(os.environ) if environ is None else environ
    explicit = config.data.unlabeled_archive or environ.get(UNLABELED_ENV_VAR)
    if not explicit:
        return None
    path = Path(explicit).expanduser()
    if not path.exists():
        origin = "data.unlabeled_archive" if config.data.unlabeled_archive else UNLABELED_ENV_VAR
        raise MissingInputError(f"unlabeled reviews not found: {path} (from {origin})")
    return path


def read_unlabeled(config: Config, explicit: Path | None, labeled_source: Path) -> pd.DataFrame | None:
    """The unlabeled reviews as a ``text`` frame: from ``explicit`` (errors name it), else from the
    labeled source's own ``train/unsup`` when it has one, else None."""
    if explicit is not None:
        return pd.DataFrame({"text": read_unlabeled_texts(explicit, config.data.max_unlabeled)})
    try:
        return pd.DataFrame({"text": read_unlabeled_texts(labeled_source, config.data.max_unlabeled)})
    except (InputError, MissingInputError):  # this copy of the dataset has no unlabeled part
        return None


def _imdb_splits(config: Config, force: bool) -> tuple[dict[str, pd.DataFrame], list[str], dict, dict, str,
                                                        pd.DataFrame | None]:
    """(splits, label names, inputs, manifest fields, source, unlabeled) for the aclImdb archive or folder."""
    source = resolve_source(config)
    if source.is_dir():
        root = dataset_root(source)
        source_checksum = f"folder:{folder_fingerprint(root)}"
    else:
        source_checksum = sha256_file(source)
        verify_checksums(source, config, source_checksum)
    inputs = {"archive_sha256": source_checksum}
    unlabeled_source = resolve_unlabeled_source(config)
    if unlabeled_source is not None:
        inputs["unlabeled_sha256"] = (sha256_file(unlabeled_source) if unlabeled_source.is_file()
                                      else f"folder:{unlabeled_source.resolve()}")
    if not force and _skip(config, inputs, source):
        return {}, [], inputs, {}, str(source), None
    members = iter_folder(root) if source.is_dir() else iter_archive(source)
    progress = tqdm(members, desc=f"reading {source.name}", unit=" files", mininterval=1.0)
    frame, report = collect_reviews(progress, str(source))
    if report.skipped_count:
        print(
            f"ingest: warning: skipped {report.skipped_count} file(s) not named <id>_<rating>.txt, "
            f"e.g. {', '.join(report.skipped_names)}"
        )
    original_train = frame[frame["split"] == "train"].drop(columns="split").reset_index(drop=True)
    test = frame[frame["split"] == "test"].drop(columns="split").reset_index(drop=True)
    train, val = split_train_validation(original_train, config.data.validation_fraction, config.data.seed)
    splits = {"train": train, "val": val, "test": test}
    unlabeled = read_unlabeled(config, unlabeled_source, source)
    fields = {
        "archive_sha256": source_checksum,
        "duplicates": duplicate_counts(original_train, test),
        "decode_error_files": report.decode_error_files,
        "skipped_files": {"count": report.skipped_count, "examples": report.skipped_names},
        "unlabeled_source": str(unlabeled_source or (source if unlabeled is not None else "none")),
    }
    return splits, list(IMDB_LABELS), inputs, fields, str(source), unlabeled


def _table_splits(config: Config, force: bool) -> tuple[dict[str, pd.DataFrame], list[str], dict, dict, str,
                                                         pd.DataFrame | None]:
    """(splits, label names, inputs, manifest fields, source, unlabeled) for the user's CSV/TSV/Parquet files."""
    files = find_table_files(config.data.path)
    inputs = {"files_sha256": {str(f): sha256_file(f) for f in files}}
    unlabeled_source = resolve_unlabeled_source(config)
    if unlabeled_source is not None:
        inputs["unlabeled_sha256"] = sha256_file(unlabeled_source) if unlabeled_source.is_file() else "folder"
    if not force and _skip(config, inputs, config.data.path):
        return {}, [], inputs, {}, config.data.path, None
    splits, labels, drops, _ = load_table_splits(config.data)
    if drops.count:
        print(f"ingest: warning: dropped {drops.count} row(s) with empty text or label "
              f"({drops.reasons}), e.g. {'; '.join(drops.examples)}")
    fields = {"dropped_rows": {"count": drops.count, "reasons": drops.reasons, "examples": drops.examples},
              "duplicates": duplicate_counts(pd.concat([splits["train"], splits["val"]]), splits["test"]),
              "unlabeled_source": str(unlabeled_source or "none")}
    unlabeled = None if unlabeled_source is None else read_unlabeled(config, unlabeled_source, unlabeled_source)
    return splits, labels, inputs, fields, config.data.path, unlabeled


def _skip(config: Config, inputs: dict, source) -> bool:
    out_dir = stage_dir(config, STAGE)
    config_hash = config.section_hash("data")
    if is_up_to_date(out_dir, config_hash, inputs, list(SPLIT_FILES) + [LABELS_FILE]):
        print(f"ingest: up to date, nothing to do ({out_dir}/ built from {source} with config {config_hash})")
        return True
    return False


def run(config: Config, force: bool = False) -> Path:
    """Run ingestion and return ``data/ingest``; skips when inputs and config are unchanged."""
    started = time.perf_counter()
    out_dir = stage_dir(config, STAGE)
    reader = _table_splits if config.data.source == "table" else _imdb_splits
    splits, labels, inputs, fields, source, unlabeled = reader(config, force)
    if not splits:  # up to date
        return out_dir
    for split in splits.values():
        split["label_name"] = [labels[i] for i in split["label"]]
    config_hash = config.section_hash("data")
    manifest = build_manifest(
        STAGE,
        config_hash,
        inputs,
        config.to_dict()["data"],
        source=str(source),
        label_names=labels,
        rows={name: len(split) for name, split in splits.items()},
        labels={name: {labels[k]: int(v) for k, v in split["label"].value_counts().sort_index().items()}
                for name, split in splits.items()},
        length_words={name: length_percentiles(split["text"]) for name, split in splits.items()},
        split_checksums={name: sha256_text("\n".join(split["source_file"])) for name, split in splits.items()},
        unlabeled_rows=0 if unlabeled is None else len(unlabeled),
        **fields,
    )
    with staged_directory(out_dir) as staging:
        for name, split in splits.items():
            split.loc[:, list(COLUMNS)].to_parquet(staging / f"{name}.parquet", index=False)
        if unlabeled is not None:
            unlabeled.to_parquet(staging / UNLABELED_FILE, index=False)
        save_labels(staging, labels)
        write_manifest(staging, manifest)
    rows = manifest["rows"]
    print(
        f"ingest: read {sum(rows.values()):,} labelled texts from {source}; wrote train {rows['train']:,} / "
        f"val {rows['val']:,} / test {rows['test']:,} rows ({len(labels)} classes) and "
        f"{manifest['unlabeled_rows']:,} unlabeled reviews to {out_dir}/ in {time.perf_counter() - started:.1f}s"
    )
    return out_dir


def main(config: Config, args) -> None:
    run(config, force=args.force)
