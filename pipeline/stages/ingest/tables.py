"""Bring-your-own labelled data: CSV, TSV or Parquet tables -> train/val/test frames.

Pure functions over DataFrames plus one reader at the edge. Used by the ingestion stage
when ``data.source: table``. Rows with a missing or blank text or label are dropped and
reported (up to 10 row numbers); everything else that is wrong (missing columns, files
that disagree on columns, unknown split values, labels in val/test never seen in train,
a single class) is an error naming the file, row and column.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from pipeline.config import DataConfig
from pipeline.core.errors import ConfigError, InputError, MissingInputError

SUFFIXES = {".csv": ",", ".tsv": "\t", ".parquet": None}
SPLIT_VALUES = ("train", "val", "test")
MAX_EXAMPLES = 10


@dataclass
class DropReport:
    count: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, where: str, reason: str) -> None:
        self.count += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where} ({reason})")


def find_table_files(pattern: str) -> list[Path]:
    """A file, a folder (its .csv/.tsv/.parquet files) or a glob, sorted; error when nothing matches."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
    elif path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).suffix.lower() in SUFFIXES)
    if not files:
        raise MissingInputError(f"data.path {pattern!r} matches no .csv, .tsv or .parquet file")
    return files


def read_table(path: Path) -> pd.DataFrame:
    """Every column as Python objects; CSV/TSV values stay strings (missing -> empty)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(f"{path}: unsupported file type {suffix!r} (use .csv, .tsv or .parquet)")
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path).astype(object)
        return pd.read_csv(path, sep=SUFFIXES[suffix], dtype=object, keep_default_na=False, encoding="utf-8-sig")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read as {suffix[1:].upper()}: {exc}") from None


def _blank(value) -> bool:
    return value is None or (isinstance(value, float) and value != value) or not str(value).strip()


def sort_labels(labels) -> list[str]:
    """Label names sorted numerically when they are all integers, else alphabetically."""
    labels = list(set(labels))
    try:
        return [str(x) for x in sorted(labels, key=lambda v: int(v))]
    except ValueError:
        return sorted(labels)


def combine_tables(tables: list[tuple[str, pd.DataFrame]], config: DataConfig) -> tuple[pd.DataFrame, DropReport]:
    """One frame with ``text``, ``label_name``, ``split`` (or None) and ``source_file`` (file:row)."""
    reference_name, reference = tables[0]
    for name, frame in tables[1:]:
        if list(frame.columns) != list(reference.columns):
            raise InputError(
                f"{name} has columns {list(frame.columns)} but {reference_name} has "
                f"{list(reference.columns)}: all files must have the same columns"
            )
    needed = [config.text_column, config.label_column] + [c for c in (config.split_column, config.group_column) if c]
    for column in needed:
        if column not in reference.columns:
            raise InputError(f"{reference_name}: no column {column!r}; columns are {list(reference.columns)}")
    drops = DropReport()
    rows = []
    for name, frame in tables:
        for number, (text, label, split, group) in enumerate(
            zip(
                frame[config.text_column],
                frame[config.label_column],
                frame[config.split_column] if config.split_column else [None] * len(frame),
                frame[config.group_column] if config.group_column else [None] * len(frame),
            ),
            start=1,
        ):
            where = f"{name} row {number}"
            if _blank(text):
                drops.add(where, f"empty {config.text_column}")
                continue
            if _blank(label):
                drops.add(where, f"empty {config.label_column}")
                continue
            if split is not None:
                split = str(split).strip().lower()
                if split not in SPLIT_VALUES:
                    raise InputError(
                        f"{where}: column {config.split_column!r} has {split!r}; "
                        f"allowed values are {list(SPLIT_VALUES)}"
                    )
            if config.group_column and _blank(group):
                raise InputError(f"{where}: empty {config.group_column!r} (data.group_column): every row needs a group")
            rows.append(
                (
                    str(text).strip(),
                    str(label).strip(),
                    split,
                    None if group is None else str(group).strip(),
                    f"{name}:{number}",
                )
            )
    return pd.DataFrame(rows, columns=["text", "label_name", "split", "group", "source_file"]), drops


def held_out_split(
    frame: pd.DataFrame, fraction: float, seed: int, label_column: str = "label_name", groups: pd.Series | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept, held out): about ``fraction`` of the rows held out, seeded, stratified by label where it can be.

    With ``groups`` every group lands on one side (scikit-learn's ``StratifiedGroupKFold``, one fold held
    out), so a held-out review never shares its group (its movie) with a kept one.
    """
    if groups is not None:
        from sklearn.model_selection import StratifiedGroupKFold

        folds = max(2, round(1 / fraction))
        if groups.nunique() < folds:
            raise InputError(
                f"{groups.nunique()} groups cannot be split {folds} ways for a held-out fraction of "
                f"{fraction}: use more groups or a larger fraction"
            )
        splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
        kept, held_out = next(splitter.split(frame, frame[label_column], groups))
        return frame.iloc[np.sort(kept)], frame.iloc[np.sort(held_out)]
    counts = frame[label_column].value_counts()
    stratify = frame[label_column] if counts.min() >= 2 and len(frame) * fraction >= len(counts) else None
    kept, held_out = train_test_split(frame, test_size=fraction, random_state=seed, stratify=stratify)
    return kept.sort_index(), held_out.sort_index()


def _split(frame: pd.DataFrame, fraction: float, seed: int, by_group: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    return held_out_split(frame, fraction, seed, groups=frame["group"] if by_group else None)


def split_rule(config: DataConfig) -> str:
    """How ``split_table`` draws the splits, for the manifest and the reports."""
    if config.split_column:
        return f"split column {config.split_column!r}" + (
            f"; validation from train by whole {config.group_column!r} groups" if config.group_column else ""
        )
    if config.group_column:
        return f"whole {config.group_column!r} groups, stratified by label, seeded"
    return "stratified by label, seeded"


def split_table(frame: pd.DataFrame, config: DataConfig) -> dict[str, pd.DataFrame]:
    """Train/val/test from the split column, or stratified seeded fractions when there is none."""
    if config.split_column:
        splits = {name: frame[frame["split"] == name] for name in SPLIT_VALUES}
        if splits["val"].empty and not splits["train"].empty:
            splits["train"], splits["val"] = _split(
                splits["train"], config.validation_fraction, config.seed, bool(config.group_column)
            )
    else:
        rest, test = _split(frame, config.test_fraction, config.seed, bool(config.group_column))
        train, val = _split(rest, config.validation_fraction, config.seed, bool(config.group_column))
        splits = {"train": train, "val": val, "test": test}
    for name, split in splits.items():
        if split.empty:
            raise InputError(f"the {name} split is empty (check data.{config.split_column or 'test_fraction'})")
    return {name: split.drop(columns=["split", "group"]).reset_index(drop=True) for name, split in splits.items()}


def label_set(splits: dict[str, pd.DataFrame], label_column: str) -> list[str]:
    """Sorted labels of the train split; errors for a single class or unseen val/test labels."""
    labels = sort_labels(splits["train"]["label_name"])
    if len(labels) < 2:
        raise InputError(
            f"column {label_column!r} has a single class in the train split ({labels}); a classifier needs at least two"
        )
    for name in ("val", "test"):
        unseen = splits[name][~splits[name]["label_name"].isin(labels)]
        if len(unseen):
            examples = ", ".join(f"{r.source_file} ({r.label_name!r})" for r in unseen.head(MAX_EXAMPLES).itertuples())
            raise InputError(f"{len(unseen)} {name} row(s) have a {label_column!r} never seen in train: {examples}")
    return labels


def load_table_splits(config: DataConfig) -> tuple[dict[str, pd.DataFrame], list[str], DropReport, list[Path]]:
    """Read ``config.path`` and return (splits with integer ``label``, label names, drops, files)."""
    if config.path is None:
        raise ConfigError("data.source 'table' needs data.path (a CSV, TSV or Parquet file, a glob or a folder)")
    files = find_table_files(config.path)
    frame, drops = combine_tables([(str(f), read_table(f)) for f in files], config)
    if frame.empty:
        raise InputError(f"{config.path}: no usable rows ({drops.count} dropped: {drops.reasons})")
    splits = split_table(frame, config)
    labels = label_set(splits, config.label_column)
    index = {name: i for i, name in enumerate(labels)}
    for split in splits.values():
        split["label"] = split["label_name"].map(index).astype("int64")
        split["review_id"] = range(len(split))
        split["rating"] = pd.array([None] * len(split), dtype="Int64")
    return splits, labels, drops, files
