"""Scoring a CSV in this process: a probability, a label and an error column added to every row.

The local engine of ``make score`` (``pipeline/stages/score/__init__.py``; ``pipeline.stages.score.spark`` is the
other).

Reads:  a CSV of reviews (``--input``; any columns, text in ``--text-column``) and a model:
        ``models:/<name>@<alias>`` (default ``models:/<registered name>@champion``),
        ``runs:/<run_id>/model`` or a local MLflow model folder.
Writes: ``--output``, a CSV with every input column and row in the input's order plus
        ``positive_probability``, ``predicted_label`` (``positive``/``negative``) and
        ``score_error`` (empty when the row was scored); a model with more than two classes
        adds one ``probability_<label>`` column per class instead of ``positive_probability``; with
        ``--explain`` an ``explanation`` column (the words or n-grams behind each score,
        ``pipeline.model.explain``). It is written to a temporary file beside the output and renamed
        at the end, so an interrupted run leaves no partial file.

The input is streamed in chunks, so memory stays flat for any file size; a read-ahead thread
parses, checks and tokenizes the next chunk while the model scores the current one. Every value is
read as text and written back unchanged. Rows whose text is missing, blank or not text,
or holds undecodable bytes, get a ``score_error`` message instead of a score.
"""

from __future__ import annotations

import csv
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
from tqdm.auto import tqdm

from pipeline.config import TrackingConfig
from pipeline.core.errors import ConfigError, InputError, MissingInputError
from pipeline.core.files import new_file_mode
from pipeline.model.classifiers import (
    ERROR_COLUMN,
    PipelineModel,
    explanation_column,
    load_classifier,
    output_columns,
    output_frame,
)
from pipeline.model.explain import EXPLANATION_COLUMN
from pipeline.text.conventions import NOT_UNICODE, text_problem
from pipeline.text.crops import word_counts

_UNDECODABLE_RE = re.compile("[\udc80-\udcff]")
EXPLAIN_CHUNK = 256  # rows read at a time when explaining


# --------------------------------------------------------------------------- pure functions


@dataclass
class PreparedChunk:
    """A chunk checked and prepared (tokenized, n-grams counted), ready for the model."""

    chunk: pd.DataFrame  # the input rows, undecodable bytes shown as U+FFFD
    errors: list[str]  # per row: why it cannot be scored, or ""
    scorable: list[int]  # positions of the rows to score
    features: object  # what the model's ``prepare`` made of them (token ids, n-gram counts, both)
    words: np.ndarray | None = None  # the scorable rows' word counts


def prepare_chunk(
    chunk: pd.DataFrame, text_column: str, classifier: PipelineModel, first_row: int, encoding: str
) -> PreparedChunk:
    """Check every row's text and prepare the scorable ones (the part that can run ahead of the model).

    Values are Python strings (object dtype): Arrow-backed strings cannot hold the surrogate
    escapes that mark undecodable bytes. ``first_row`` is the 1-based data-row number of the
    chunk's first row, for messages.
    """
    texts = chunk[text_column].tolist()
    errors = [text_problem(text) for text in texts]
    for index, error in enumerate(errors):  # text_problem already found them: name the row and the encoding
        if error == NOT_UNICODE and _UNDECODABLE_RE.search(texts[index]):
            errors[index] = f"row {first_row + index}: undecodable bytes for encoding {encoding}"
    scorable = [i for i, error in enumerate(errors) if not error]
    clean = chunk.copy()
    for column in chunk.columns:  # surrogate-escaped bytes cannot be written as UTF-8
        if has_undecodable(clean[column]):
            clean[column] = clean[column].map(lambda v: _UNDECODABLE_RE.sub("\ufffd", v) if isinstance(v, str) else v)
    return PreparedChunk(
        clean,
        errors,
        scorable,
        classifier.prepare([texts[i] for i in scorable]),
        word_counts([texts[i] for i in scorable]),
    )


def has_undecodable(values) -> bool:
    """Whether any string among ``values`` holds surrogate-escaped bytes: one UTF-8 encode of them all,
    instead of a regular-expression search per cell (most chunks have none)."""
    try:
        "".join(v for v in values if isinstance(v, str)).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@dataclass(frozen=True)
class RowNotes:
    """What a scored row gets besides its score: counted as short below ``min_words`` words (0: not known), and an
    explanation of ``explain_top`` items (0: none)."""

    min_words: int = 0
    explain_top: int = 0


def finish_chunk(prepared: PreparedChunk, classifier: PipelineModel, explain_top: int = 0) -> pd.DataFrame:
    """The chunk with the probability, label and error columns added (and with ``explain_top`` the explanation of
    each scored row, ``pipeline.model.explain``); rows keep their order."""
    chunk = prepared.chunk
    scored = output_frame(classifier.score(prepared.features), classifier.labels, prepared.errors)
    if explain_top:
        scored[EXPLANATION_COLUMN] = explanation_column(
            classifier.explanations(prepared.features, explain_top), prepared.errors
        )
    scored.index = chunk.index
    out = chunk.copy()
    for column in scored.columns:  # rows with an error: empty probability and label cells
        out[column] = scored[column]
    return out


# --------------------------------------------------------------------------- I/O edges


def read_ahead(chunks):
    """The items of ``chunks``, with the next one produced in a background thread meanwhile."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="csv-reader") as reader:
        pending = reader.submit(next, chunks, None)
        while (chunk := pending.result()) is not None:
            pending = reader.submit(next, chunks, None)
            yield chunk


def prepared_chunks(reader, text_column: str, classifier: PipelineModel, encoding: str):
    """Each chunk of ``reader`` checked and prepared, numbering data rows from 1 for messages (runs in the
    read-ahead thread: parse, check, tokenize)."""
    first_row = 1
    for chunk in reader:
        yield prepare_chunk(chunk, text_column, classifier, first_row, encoding)
        first_row += len(chunk)


def header_columns(input_path: Path, output_path: Path, text_column: str, encoding: str, chunk_size: int) -> list[str]:
    """The input CSV's columns, once the paths, the chunk size and the text column are checked (the checks that need
    no model, so a bad call fails before the model loads)."""
    if not input_path.is_file():
        raise MissingInputError(f"input CSV not found: {input_path}")
    if output_path.resolve() == input_path.resolve():
        raise InputError(f"refusing to overwrite the input {input_path}: choose another OUTPUT")
    if chunk_size < 1:
        raise ConfigError("--chunk-size must be positive")
    try:
        header = pd.read_csv(input_path, nrows=0, encoding=encoding, encoding_errors="surrogateescape")
    except (pd.errors.EmptyDataError, pd.errors.ParserError, LookupError) as exc:
        raise InputError(f"{input_path}: cannot read as CSV: {exc}") from None
    columns = list(header.columns)
    if text_column not in columns:
        raise InputError(
            f"{input_path}: no column {text_column!r}; columns are {columns} (use --text-column / TEXT_COLUMN=)"
        )
    return columns


def write_scored_chunks(
    out, chunks, classifier: PipelineModel, progress, input_path: Path, notes: RowNotes = RowNotes()
) -> dict[str, int]:
    """Write each prepared chunk of ``chunks``, scored, to ``out`` (the header with the first); returns the row, error
    and positive counts, and of the scored rows those shorter than ``notes.min_words`` words (``scored`` filled in by
    the caller)."""
    counts = {"rows": 0, "scored": 0, "errors": 0, "positives": 0, "short": 0}
    try:
        for prepared in read_ahead(chunks):
            scored = finish_chunk(prepared, classifier, notes.explain_top)
            scored.to_csv(out, header=counts["rows"] == 0, index=False, quoting=csv.QUOTE_MINIMAL)
            counts["rows"] += len(scored)
            counts["errors"] += int((scored[ERROR_COLUMN] != "").sum())
            counts["short"] += int((prepared.words < notes.min_words).sum())
            if len(classifier.labels) == 2:
                counts["positives"] += int((scored["predicted_label"] == classifier.labels[1]).sum())
            progress.update(len(scored))
    except pd.errors.ParserError as exc:
        raise InputError(f"{input_path}: malformed CSV after data row {counts['rows']}: {exc}") from None
    return counts


class ReadProgress:
    """The progress bar over the input's bytes read (so it gives the share done and the time left, which a row count
    cannot before the end), with the rows written beside it."""

    def __init__(self, bar, source):
        self.bar, self.source, self.rows = bar, source, 0

    def update(self, rows: int) -> None:
        self.rows += rows
        self.bar.set_postfix_str(f"{self.rows:,} rows", refresh=False)
        self.bar.update(max(0, min(self.source.tell(), self.bar.total) - self.bar.n))


def write_scored_csv(
    input_path: Path,
    output_path: Path,
    classifier: PipelineModel,
    output_header: list[str],
    text_column: str,
    encoding: str,
    chunk_size: int,
    notes: RowNotes = RowNotes(),
) -> dict[str, int]:
    """Stream ``input_path`` through the model into a temporary file beside ``output_path``, renamed into place once
    complete (removed on any error); returns the counts. An input without rows gets ``output_header`` alone."""
    output_path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{output_path.name}.", suffix=".tmp", dir=output_path.parent)
    try:
        os.fchmod(handle, new_file_mode())  # the mode open(path, "w") gives, not mkstemp's 0o600
        with (
            os.fdopen(handle, "w", encoding="utf-8", newline="") as out,
            open(input_path, "rb") as source,
            tqdm(
                total=input_path.stat().st_size,
                unit="B",
                unit_scale=True,
                desc=f"scoring {input_path.name}",
                mininterval=0.5,
            ) as bar,
        ):
            # skip_blank_lines=False: in a one-column CSV a whitespace-only review is a line of spaces, still a row
            reader = pd.read_csv(
                source,
                dtype=object,
                keep_default_na=False,
                na_filter=False,
                chunksize=chunk_size,
                skip_blank_lines=False,
                encoding=encoding,
                encoding_errors="surrogateescape",
            )
            counts = write_scored_chunks(
                out,
                prepared_chunks(reader, text_column, classifier, encoding),
                classifier,
                ReadProgress(bar, source),
                input_path,
                notes,
            )
            if counts["rows"] == 0:
                pd.DataFrame(columns=output_header).to_csv(out, index=False)
        os.replace(tmp_name, output_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return counts


def score_csv(
    tracking: TrackingConfig,
    input_path: str | Path,
    output_path: str | Path,
    model_uri: str | None = None,
    text_column: str = "text",
    encoding: str = "utf-8-sig",
    chunk_size: int = 2048,
    explain_top: int = 0,
) -> dict[str, float]:
    """Score ``input_path`` into ``output_path``; returns the summary counts. With ``explain_top`` every scored row
    also gets that many words or n-grams behind its score (``explanation``), read in chunks of at most
    ``EXPLAIN_CHUNK`` rows so the progress bar moves (integrated gradients cost many forward passes a row)."""
    if explain_top < 0:
        raise ConfigError(f"--explain-top must be 0 (no explanations) or more, got {explain_top}")
    explain = explain_top > 0
    from pipeline.tracking import VALIDATED_MIN_WORDS, champion_uri, model_run_metric, setup_tracking

    started = time.perf_counter()
    input_path, output_path = Path(input_path), Path(output_path)
    columns = header_columns(input_path, output_path, text_column, encoding, chunk_size)
    setup_tracking(tracking)
    model_uri = model_uri or champion_uri(tracking)
    classifier = load_classifier(model_uri)
    load_seconds = time.perf_counter() - started  # header check and model load, inside this call
    startup_seconds = time.time() - psutil.Process().create_time()  # interpreter, imports and model load
    added = output_columns(classifier.labels, explain)
    clashes = [c for c in added if c in columns]
    if clashes:
        raise InputError(
            f"{input_path}: already has output column(s) {clashes}; rename them or score the original file"
        )
    min_words = int(model_run_metric(model_uri, VALIDATED_MIN_WORDS) or 0)  # 0: not known (a model folder)
    counts = write_scored_csv(
        input_path,
        output_path,
        classifier,
        columns + added,
        text_column,
        encoding,
        min(chunk_size, EXPLAIN_CHUNK) if explain else chunk_size,
        RowNotes(min_words, explain_top),
    )
    counts["scored"] = counts["rows"] - counts["errors"]
    seconds = time.perf_counter() - started
    streaming = counts["rows"] / max(seconds - load_seconds, 1e-9)
    positives = f", positives {counts['positives']:,}" if len(classifier.labels) == 2 else ""
    short = f", {counts['short']:,} shorter than the {min_words} words the model was validated on" if min_words else ""
    explained = f" and explained ({EXPLANATION_COLUMN}: top {explain_top})" if explain else ""
    print(
        f"score: read {counts['rows']:,} rows from {input_path}; scored{explained} {counts['scored']:,}{short}, "
        f"errors {counts['errors']:,}{positives}; wrote {output_path} with {model_uri} "
        f"in {seconds:.1f}s ({counts['rows'] / max(seconds, 1e-9):,.0f} rows/s; {streaming:,.0f} rows/s after the "
        f"{load_seconds:.1f}s model load; start-up before reading {startup_seconds:.1f}s: interpreter, imports, "
        f"model load)"
    )
    return {**counts, "seconds": seconds, "load_seconds": load_seconds, "startup_seconds": startup_seconds}
