"""The IMDB Large Movie Review Dataset: where its archive is, reading it safely, its checksums and download.

Reads an aclImdb ``.tar.gz`` or ``aclImdb/`` folder (``data.archive``, ``$IMDB_ARCHIVE``,
``data/raw/aclImdb_v1.tar.gz``, or the canonical download, in that order) and the unlabeled reviews
(``data.unlabeled_archive`` or ``$IMDB_UNSUP_ARCHIVE``, else the archive's own ``train/unsup``).
Writes only a downloaded archive (``data/raw/``).

The archive is streamed member by member and never extracted, so no member path can
write anywhere; members whose paths would escape an extraction folder (``..``,
absolute paths, links, devices) are still rejected because such an archive is not
one we should trust.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pandas as pd
from tqdm.auto import tqdm

from pipeline.config import DataConfig
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import file_digest, sha256_file
from pipeline.text.conventions import clean_text

ARCHIVE_ENV_VAR = "IMDB_ARCHIVE"
UNLABELED_ENV_VAR = "IMDB_UNSUP_ARCHIVE"
CANONICAL_ARCHIVE_NAME = "aclImdb_v1.tar.gz"
COLUMNS = ("review_id", "text", "label", "label_name", "rating", "source_file")
IMDB_LABELS = ("negative", "positive")  # label 0 = neg folder, 1 = pos folder
CLASS_FOLDERS = ("train/pos", "train/neg", "test/pos", "test/neg")
LABELS = {"pos": 1, "neg": 0}

_MEMBER_RE = re.compile(r"^(?:aclImdb/)?(train|test)/(pos|neg)/([^/]+)$")
_URLS_RE = re.compile(r"^(?:aclImdb/)?(train|test)/urls_(pos|neg)\.txt$")  # line i: the movie of review i
_LABELED_RE = re.compile(f"{_MEMBER_RE.pattern}|{_URLS_RE.pattern}")
_MOVIE_RE = re.compile(r"/title/(tt\d+)")
_FILE_NAME_RE = re.compile(r"^(\d+)_(\d+)\.txt$")
_MAX_REPORTED_NAMES = 10


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
        raise InputError(f"{source}: refusing archive member {name!r}: its path would escape the destination folder")


@dataclass
class CollectReport:
    """What collecting reviews from a source found besides the reviews themselves."""

    skipped_names: list[str] = field(default_factory=list)
    skipped_count: int = 0
    movies: dict[str, list[str]] = field(default_factory=dict)  # "train/pos" -> movie of review id i, from urls_*.txt
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
        urls = _URLS_RE.match(name)
        if urls:
            report.movies[f"{urls.group(1)}/{urls.group(2)}"] = [
                movie_of(line) for line in decode_review(data)[0].splitlines()
            ]
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


def movie_of(url: str) -> str:
    """``http://www.imdb.com/title/tt0453418/usercomments`` -> ``tt0453418`` (the URL itself when it has no id)."""
    match = _MOVIE_RE.search(url)
    return match.group(1) if match else url.strip()


def review_movies(frame: pd.DataFrame, movies: dict[str, list[str]]) -> pd.Series | None:
    """The movie of every row of ``frame`` (``train/pos/<id>_<rating>.txt`` is line ``id`` of ``train/urls_pos.txt``),
    or None when the archive has no urls file for one of its folders or a line is missing."""
    groups = []
    for source, review_id in zip(frame["source_file"], frame["review_id"]):
        folder = source.rsplit("/", 1)[0]
        lines = movies.get(folder)
        if lines is None or review_id >= len(lines):
            return None
        groups.append(lines[review_id])
    return pd.Series(groups, index=frame.index)


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
    for split in ("train", "test"):  # which movie each review is about, when the folder says
        for polarity in ("pos", "neg"):
            urls = root / split / f"urls_{polarity}.txt"
            if urls.is_file() and not urls.is_symlink():
                yield f"{split}/urls_{polarity}.txt", urls.read_bytes()


_UNLABELED_RE = re.compile(r"^(?:aclImdb/)?train/unsup/[^/]+\.txt$")


def read_unlabeled_texts(path: Path, limit: int | None = None) -> list[str]:
    """Cleaned texts of ``train/unsup/*.txt`` from an aclImdb archive or folder (for pretraining)."""
    members: Iterator[tuple[str, bytes | None]]
    if path.is_dir():
        folder = dataset_root(path) / "train" / "unsup"
        if not folder.is_dir():
            raise MissingInputError(f"{path}: no train/unsup folder of unlabeled reviews")
        members = ((f.name, f.read_bytes()) for f in sorted(folder.iterdir()) if f.suffix == ".txt")
    elif path.is_file():
        members = iter_archive(path, wanted=_UNLABELED_RE)
    else:
        raise MissingInputError(f"unlabeled corpus not found: {path}")
    texts: list[str] = []
    for _name, data in tqdm(members, desc=f"reading {path.name}", unit=" files", mininterval=1.0):
        if limit is not None and len(texts) >= limit:
            break
        if data is not None:
            texts.append(clean_text(decode_review(data)[0]))
    if not texts:
        raise InputError(f"{path}: holds no train/unsup/*.txt reviews")
    return texts


def folder_fingerprint(root: Path, folders: Iterable[str]) -> str:
    """``folder:<sha256>`` of the files in ``root/<folder>`` for each of ``folders``: their relative names and bytes.

    By content, not by size and modification time: an edited review changes it even when its size
    and timestamp do not (an editor that restores them, a copy with ``cp -p``).
    """
    digest = hashlib.sha256()
    for folder in folders:
        directory = root / folder
        if directory.is_dir():
            for entry in sorted(directory.iterdir()):
                if entry.is_file():
                    digest.update(f"{folder}/{entry.name}\0".encode())
                    digest.update(hashlib.sha256(entry.read_bytes()).digest())
    return f"folder:{digest.hexdigest()}"


def source_checksum(path: Path, folders: Iterable[str]) -> str:
    """sha256 of an archive file, or :func:`folder_fingerprint` of an extracted folder."""
    return sha256_file(path) if path.is_file() else folder_fingerprint(dataset_root(path), folders)


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


def names_a_source(data: DataConfig, data_dir: Path, environ: dict[str, str] | None = None) -> bool:
    """Whether this run names an archive or folder to read (``data.archive``, ``$IMDB_ARCHIVE``, ``data/raw/``, the
    unlabeled reviews' settings): without one, an up-to-date ingestion is kept as it is (its source remembered)."""
    environ = dict(os.environ) if environ is None else environ
    return bool(
        data.archive
        or environ.get(ARCHIVE_ENV_VAR)
        or data.unlabeled_archive
        or environ.get(UNLABELED_ENV_VAR)
        or (Path(data_dir) / "raw" / CANONICAL_ARCHIVE_NAME).exists()
    )


def resolve_source(data: DataConfig, data_dir: Path, environ: dict[str, str] | None = None) -> Path:
    """The dataset path by precedence: data.archive, $IMDB_ARCHIVE, <data_dir>/raw/..., download."""
    environ = dict(os.environ) if environ is None else environ
    explicit = data.archive or environ.get(ARCHIVE_ENV_VAR)
    if explicit:
        path = Path(explicit).expanduser()
        origin = "data.archive" if data.archive else ARCHIVE_ENV_VAR
        if not path.exists():
            raise MissingInputError(f"IMDB archive not found: {path} (from {origin})")
        return path
    canonical = Path(data_dir) / "raw" / CANONICAL_ARCHIVE_NAME
    if canonical.exists():
        return canonical
    return download_archive(data.download_url, data.download_md5, canonical)


def verify_checksums(path: Path, data: DataConfig, data_dir: Path, archive_sha256: str) -> None:
    expected = data.archive_sha256
    if expected and expected.lower() != archive_sha256:
        raise InputError(f"{path}: sha256 mismatch: expected {expected}, actual {archive_sha256}")
    canonical = Path(data_dir) / "raw" / CANONICAL_ARCHIVE_NAME
    if path.is_file() and path.resolve() == canonical.resolve():
        actual_md5 = md5_file(path)
        if actual_md5 != data.download_md5:
            raise InputError(
                f"{path}: md5 mismatch: expected {data.download_md5}, actual {actual_md5} "
                "(a partial or different download? delete it to download again)"
            )


def dataset_root(path: Path) -> Path:
    """For a folder source, accept either ``aclImdb/`` itself or a folder that contains it."""
    return path / "aclImdb" if (path / "aclImdb").is_dir() else path


def resolve_unlabeled_source(data: DataConfig, environ: dict[str, str] | None = None) -> Path | None:
    """The unlabeled reviews named by ``data.unlabeled_archive`` or ``$IMDB_UNSUP_ARCHIVE``; None when neither is
    set."""
    environ = dict(os.environ) if environ is None else environ
    explicit = data.unlabeled_archive or environ.get(UNLABELED_ENV_VAR)
    if not explicit:
        return None
    path = Path(explicit).expanduser()
    if not path.exists():
        origin = "data.unlabeled_archive" if data.unlabeled_archive else UNLABELED_ENV_VAR
        raise MissingInputError(f"unlabeled reviews not found: {path} (from {origin})")
    return path


def unlabeled_reviews(explicit: Path | None, labeled_source: Path, max_unlabeled: int | None) -> pd.DataFrame | None:
    """The unlabeled reviews as a ``text`` frame: from ``explicit`` (errors name it), else from the
    labeled source's own ``train/unsup`` when it has one, else None."""
    if explicit is not None:
        return pd.DataFrame({"text": read_unlabeled_texts(explicit, max_unlabeled)})
    try:
        return pd.DataFrame({"text": read_unlabeled_texts(labeled_source, max_unlabeled)})
    except (InputError, MissingInputError):  # this copy of the dataset has no unlabeled part
        return None


def unlabeled_checksum(path: Path) -> str:
    return source_checksum(path, ("train/unsup",))


def labeled_members(source: Path) -> Iterator[tuple[str, bytes | None]]:
    """``(member name, bytes)`` of the labelled reviews and the movie lists, from an archive or a folder."""
    return iter_folder(dataset_root(source)) if source.is_dir() else iter_archive(source, wanted=_LABELED_RE)
