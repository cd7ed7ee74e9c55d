"""``make ingest``: the IMDB archive (or the user's own tables) -> versioned Parquet splits.

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
from typing import Callable, Iterable, Iterator

import pandas as pd
from tqdm.auto import tqdm

from pipeline.artifacts import (
    LABELS_FILE,
    SPLITS,
    UNLABELED_TABLE,
    build_manifest,
    file_digest,
    is_up_to_date,
    sha256_file,
    sha256_text,
    split_table,
    staged_directory,
    write_manifest,
)
from pipeline.config import Config
from pipeline.errors import InputError, MissingInputError
from pipeline.stages import stage_dir
from pipeline.tables import find_table_files, held_out_split, load_table_splits, split_rule
from pipeline.text import clean_text, percentiles, save_labels

STAGE = "ingest"
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
            report.movies[f"{urls.group(1)}/{urls.group(2)}"] = [movie_of(line) for line in decode_review(data)[0].splitlines()]
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


def split_train_validation(train: pd.DataFrame, fraction: float, seed: int, groups: pd.Series | None = None
                           ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stratified, seeded split of ``train`` into (train, validation); with ``groups``, whole groups (movies)."""
    fit, val = held_out_split(train, fraction, seed, label_column="label", groups=groups)
    return fit.reset_index(drop=True), val.reset_index(drop=True)


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
    for split in ("train", "test"):  # which movie each review is about, when the folder says
        for polarity in ("pos", "neg"):
            urls = root / split / f"urls_{polarity}.txt"
            if urls.is_file() and not urls.is_symlink():
                yield f"{split}/urls_{polarity}.txt", urls.read_bytes()


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


@dataclass(frozen=True)
class Ingested:
    """What a source holds: the splits, the class names, manifest fields and the unlabeled reviews."""

    splits: dict[str, pd.DataFrame]     # train, val, test
    labels: list[str]                   # class names in index order
    fields: dict                        # what the manifest records about the source
    unlabeled: pd.DataFrame | None      # a ``text`` frame, when there are unlabeled reviews


@dataclass(frozen=True)
class Source:
    """A source before it is read: what it is, the checksums that decide whether to read it, and how."""

    name: str                           # the path, for people
    inputs: dict                        # recorded in the manifest; unchanged inputs and config skip the stage
    read: Callable[[], Ingested]


def unlabeled_checksum(path: Path) -> str:
    return source_checksum(path, ("train/unsup",))


def imdb_source(config: Config) -> Source:
    """The aclImdb archive or folder (``resolve_source``) and the unlabeled reviews."""
    source = resolve_source(config)
    checksum = source_checksum(source, CLASS_FOLDERS)
    if source.is_file():
        verify_checksums(source, config, checksum)
    inputs = {"archive_sha256": checksum}
    unlabeled_source = resolve_unlabeled_source(config)
    if unlabeled_source is not None:
        inputs["unlabeled_sha256"] = unlabeled_checksum(unlabeled_source)

    def read() -> Ingested:
        members = iter_folder(dataset_root(source)) if source.is_dir() else iter_archive(source, wanted=_LABELED_RE)
        progress = tqdm(members, desc=f"reading {source.name}", unit=" files", mininterval=1.0)
        frame, report = collect_reviews(progress, str(source))
        if report.skipped_count:
            print(f"ingest: warning: skipped {report.skipped_count} file(s) not named <id>_<rating>.txt, "
                  f"e.g. {', '.join(report.skipped_names)}")
        original_train = frame[frame["split"] == "train"].drop(columns="split").reset_index(drop=True)
        test = frame[frame["split"] == "test"].drop(columns="split").reset_index(drop=True)
        movies = review_movies(original_train, report.movies) if config.data.group_validation else None
        train, val = split_train_validation(original_train, config.data.validation_fraction, config.data.seed, movies)
        rule = ("whole movies (train/urls_*.txt), stratified by label, seeded" if movies is not None
                else "stratified by label, seeded" + ("" if config.data.group_validation else
                                                       " (data.group_validation is off)")
                + ("" if report.movies or not config.data.group_validation else "; the archive names no movies"))
        unlabeled = read_unlabeled(config, unlabeled_source, source)
        fields = {
            "archive_sha256": checksum,
            "duplicates": duplicate_counts(original_train, test),
            "decode_error_files": report.decode_error_files,
            "skipped_files": {"count": report.skipped_count, "examples": report.skipped_names},
            "unlabeled_source": str(unlabeled_source or (source if unlabeled is not None else "none")),
            "split_rule": rule,
        }
        return Ingested({"train": train, "val": val, "test": test}, list(IMDB_LABELS), fields, unlabeled)

    return Source(str(source), inputs, read)


def table_source(config: Config) -> Source:
    """The user's CSV/TSV/Parquet files (``data.path``) and the unlabeled reviews."""
    files = find_table_files(config.data.path)
    inputs = {"files_sha256": {str(f): sha256_file(f) for f in files}}
    unlabeled_source = resolve_unlabeled_source(config)
    if unlabeled_source is not None:
        inputs["unlabeled_sha256"] = unlabeled_checksum(unlabeled_source)

    def read() -> Ingested:
        splits, labels, drops, _ = load_table_splits(config.data)
        if drops.count:
            print(f"ingest: warning: dropped {drops.count} row(s) with empty text or label "
                  f"({drops.reasons}), e.g. {'; '.join(drops.examples)}")
        fields = {"dropped_rows": {"count": drops.count, "reasons": drops.reasons, "examples": drops.examples},
                  "duplicates": duplicate_counts(pd.concat([splits["train"], splits["val"]]), splits["test"]),
                  "unlabeled_source": str(unlabeled_source or "none"), "split_rule": split_rule(config.data)}
        unlabeled = None if unlabeled_source is None else read_unlabeled(config, unlabeled_source, unlabeled_source)
        return Ingested(splits, labels, fields, unlabeled)

    return Source(config.data.path, inputs, read)


def run(config: Config, force: bool = False) -> Path:
    """Run ingestion and return ``data/ingest``; skips when inputs and config are unchanged."""
    started = time.perf_counter()
    out_dir = stage_dir(config, STAGE)
    source = (table_source if config.data.source == "table" else imdb_source)(config)
    config_hash = config.section_hash("data")
    if not force and is_up_to_date(out_dir, config_hash, source.inputs, [split_table(s) for s in SPLITS] + [LABELS_FILE]):
        print(f"ingest: up to date, nothing to do ({out_dir}/ built from {source.name} with config {config_hash})")
        return out_dir
    ingested = source.read()
    splits, labels, unlabeled = ingested.splits, ingested.labels, ingested.unlabeled
    for split in splits.values():
        split["label_name"] = [labels[i] for i in split["label"]]
    manifest = build_manifest(
        STAGE,
        config_hash,
        source.inputs,
        config.to_dict()["data"],
        source=source.name,
        label_names=labels,
        rows={name: len(split) for name, split in splits.items()},
        labels={name: {labels[k]: int(v) for k, v in split["label"].value_counts().sort_index().items()}
                for name, split in splits.items()},
        length_words={name: length_percentiles(split["text"]) for name, split in splits.items()},
        split_checksums={name: sha256_text("\n".join(split["source_file"])) for name, split in splits.items()},
        unlabeled_rows=0 if unlabeled is None else len(unlabeled),
        **ingested.fields,
    )
    with staged_directory(out_dir) as staging:
        for name, split in splits.items():
            split.loc[:, list(COLUMNS)].to_parquet(staging / split_table(name), index=False)
        if unlabeled is not None:
            unlabeled.to_parquet(staging / UNLABELED_TABLE, index=False)
        save_labels(staging, labels)
        write_manifest(staging, manifest)
    rows = manifest["rows"]
    print(
        f"ingest: read {sum(rows.values()):,} labelled texts from {source.name}; wrote train {rows['train']:,} / "
        f"val {rows['val']:,} / test {rows['test']:,} rows ({len(labels)} classes) and "
        f"{manifest['unlabeled_rows']:,} unlabeled reviews to {out_dir}/ in {time.perf_counter() - started:.1f}s"
    )
    return out_dir


def main(config: Config, args) -> None:
    run(config, force=args.force)
