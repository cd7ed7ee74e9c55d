"""The work of ``make ingest``: the IMDB archive (or the user's own tables) -> versioned Parquet splits.

Reads:  ``data.source: imdb``: an aclImdb ``.tar.gz`` or ``aclImdb/`` folder (``data.archive``,
        ``$IMDB_ARCHIVE``, ``data/raw/aclImdb_v1.tar.gz``, or the canonical download, in that
        order); ``data.source: table``: CSV/TSV/Parquet file(s) at ``data.path`` (``pipeline.stages.ingest.tables``).
        Unlabeled reviews (``train/unsup``, for pretraining): ``data.unlabeled_archive`` or
        ``$IMDB_UNSUP_ARCHIVE`` when set, else the labeled archive's own ``train/unsup`` when it has one
        (the canonical archive does).
Writes: ``data/ingest/{train,val,test}.parquet`` (columns ``review_id``, ``text``, ``label``
        (class index), ``label_name``, ``rating``, ``source_file``), ``unlabeled.parquet`` (``text``,
        when there are unlabeled reviews), ``labels.json`` (class names, index order) and
        ``data/ingest/manifest.json``.

The archive is read by ``pipeline.stages.ingest.imdb``, never extracted. The validation split is a stratified,
seeded fraction of train; the test split is only ever read for final evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from pipeline.config import Config, DataConfig
from pipeline.core.catalog import LABELS_FILE, SPLITS, UNLABELED_TABLE, split_table, stage_dir
from pipeline.core.errors import ConfigError, MissingInputError
from pipeline.core.files import (
    build_manifest,
    is_up_to_date,
    read_manifest,
    sha256_file,
    sha256_text,
    staged_directory,
    write_manifest,
)
from pipeline.stages.ingest.imdb import (
    ARCHIVE_ENV_VAR,
    CLASS_FOLDERS,
    COLUMNS,
    IMDB_LABELS,
    collect_reviews,
    labeled_members,
    names_a_source,
    resolve_source,
    resolve_unlabeled_source,
    review_movies,
    source_checksum,
    unlabeled_checksum,
    unlabeled_reviews,
    verify_checksums,
)
from pipeline.stages.ingest.tables import find_table_files, held_out_split, load_table_splits, split_rule
from pipeline.text.conventions import percentiles, save_labels

STAGE = "ingest"


def split_train_validation(
    train: pd.DataFrame, fraction: float, seed: int, groups: pd.Series | None = None
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


@dataclass(frozen=True)
class Ingested:
    """What a source holds: the splits, the class names, manifest fields and the unlabeled reviews."""

    splits: dict[str, pd.DataFrame]  # train, val, test
    labels: list[str]  # class names in index order
    fields: dict  # what the manifest records about the source
    unlabeled: pd.DataFrame | None  # a ``text`` frame, when there are unlabeled reviews


@dataclass(frozen=True)
class Source:
    """A source before it is read: what it is, the checksums that decide whether to read it, and how."""

    name: str  # the path, for people
    inputs: dict  # recorded in the manifest; unchanged inputs and config skip the stage
    read: Callable[[], Ingested]


def imdb_source(data: DataConfig, data_dir: Path) -> Source:
    """The aclImdb archive or folder (``resolve_source``) and the unlabeled reviews."""
    source = resolve_source(data, data_dir)
    checksum = source_checksum(source, CLASS_FOLDERS)
    if source.is_file():
        verify_checksums(source, data, data_dir, checksum)
    inputs = {"archive_sha256": checksum}
    unlabeled_source = resolve_unlabeled_source(data)
    if unlabeled_source is not None:
        inputs["unlabeled_sha256"] = unlabeled_checksum(unlabeled_source)

    def read() -> Ingested:
        progress = tqdm(labeled_members(source), desc=f"reading {source.name}", unit=" files", mininterval=1.0)
        frame, report = collect_reviews(progress, str(source))
        if report.skipped_count:
            print(
                f"ingest: warning: skipped {report.skipped_count} file(s) not named <id>_<rating>.txt, "
                f"e.g. {', '.join(report.skipped_names)}"
            )
        original_train = frame[frame["split"] == "train"].drop(columns="split").reset_index(drop=True)
        test = frame[frame["split"] == "test"].drop(columns="split").reset_index(drop=True)
        movies = review_movies(original_train, report.movies) if data.group_validation else None
        train, val = split_train_validation(original_train, data.validation_fraction, data.seed, movies)
        rule = (
            "whole movies (train/urls_*.txt), stratified by label, seeded"
            if movies is not None
            else "stratified by label, seeded"
            + ("" if data.group_validation else " (data.group_validation is off)")
            + ("" if report.movies or not data.group_validation else "; the archive names no movies")
        )
        unlabeled = unlabeled_reviews(unlabeled_source, source, data.max_unlabeled)
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


def table_source(data: DataConfig) -> Source:
    """The user's CSV/TSV/Parquet files (``data.path``) and the unlabeled reviews."""
    path = data.path
    if path is None:
        raise ConfigError("data.source 'table' needs data.path (a CSV, TSV or Parquet file, a glob or a folder)")
    files = find_table_files(path)
    inputs: dict[str, dict[str, str] | str] = {"files_sha256": {str(f): sha256_file(f) for f in files}}
    unlabeled_source = resolve_unlabeled_source(data)
    if unlabeled_source is not None:
        inputs["unlabeled_sha256"] = unlabeled_checksum(unlabeled_source)

    def read() -> Ingested:
        splits, labels, drops, _ = load_table_splits(data)
        if drops.count:
            print(
                f"ingest: warning: dropped {drops.count} row(s) with empty text or label "
                f"({drops.reasons}), e.g. {'; '.join(drops.examples)}"
            )
        fields = {
            "dropped_rows": {"count": drops.count, "reasons": drops.reasons, "examples": drops.examples},
            "duplicates": duplicate_counts(pd.concat([splits["train"], splits["val"]]), splits["test"]),
            "unlabeled_source": str(unlabeled_source or "none"),
            "split_rule": split_rule(data),
        }
        unlabeled = (
            None
            if unlabeled_source is None
            else unlabeled_reviews(unlabeled_source, unlabeled_source, data.max_unlabeled)
        )
        return Ingested(splits, labels, fields, unlabeled)

    return Source(path, inputs, read)


def ingest(config: Config, force: bool = False) -> Path:
    """Run ingestion and return ``data/ingest``; skips when inputs and config are unchanged."""
    started = time.perf_counter()
    out_dir = stage_dir(config, STAGE)
    config_hash = config.section_hash("data")
    outputs = [split_table(s) for s in SPLITS] + [LABELS_FILE]
    recorded = read_manifest(out_dir) or {}
    if (
        not force
        and config.data.source == "imdb"
        and not names_a_source(config.data, config.data_dir)
        and is_up_to_date(out_dir, config_hash, recorded.get("inputs", {}), outputs)
    ):
        print(
            f"ingest: up to date, nothing to do ({out_dir}/ built from {recorded.get('source')} with config "
            f"{config_hash}; no archive named now: {ARCHIVE_ENV_VAR} is needed only to read it again)"
        )
        return out_dir
    try:
        source = (
            table_source(config.data) if config.data.source == "table" else imdb_source(config.data, config.data_dir)
        )
    except MissingInputError as error:  # offline, nothing named: say where the last ingestion read it
        if recorded.get("source"):
            raise MissingInputError(
                f"{error} ({out_dir}/ was last built from {recorded['source']}: "
                f"{ARCHIVE_ENV_VAR}={recorded['source']} reads it again)"
            ) from None
        raise
    if not force and is_up_to_date(out_dir, config_hash, source.inputs, outputs):
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
        labels={
            name: {labels[k]: int(v) for k, v in split["label"].value_counts().sort_index().items()}
            for name, split in splits.items()
        },
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
