"""Text conventions shared by ingestion, tokenization and inference (no I/O beyond label files).

- ``clean_text``: the one cleaning rule for every review, at ingestion and at scoring time.
- Reserved token ids: ``[PAD]`` = 0, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``; every vocabulary starts
  with them (vocabularies learned before pretraining existed have the first four only).
- ``labels.json``: the class names in index order, written by ingestion and carried with every model.

This module imports nothing heavy, so the scoring path (the MLflow pyfunc model) loads
without the ingestion, download or scikit-learn code.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.core.catalog import LABELS_FILE
from pipeline.core.errors import MissingInputError
from pipeline.core.files import atomic_write_json

RESERVED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(RESERVED_TOKENS))
REQUIRED_RESERVED = 4  # [MASK] is only needed for pretraining; older vocabularies stop at [SEP]

# the reasons ``text_problem`` gives (``score_error``), the same from every scorer and the exported graph
MISSING_TEXT = "missing or empty text"
WHITESPACE_TEXT = "whitespace-only text"
NUMBER_TEXT = "not text (a number)"
NOT_UNICODE = "not valid Unicode text (unpaired surrogate characters)"
_BREAK_RE = re.compile(r"<br\s*/?>", flags=re.IGNORECASE)
_NUMBER_RE = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def text_problem(value) -> str:
    """Why ``value`` cannot be scored as a review, or "" when it can.

    The one rule for unscorable input, whatever the client (``make score``, the pyfunc model in
    ``mlflow models predict/serve`` and Spark): a missing value, an empty or whitespace-only
    string, anything that is not text (a number, or a string holding only a number), and a string that is
    not valid Unicode (unpaired surrogates, which no tokenizer can take).
    """
    if value is None or (isinstance(value, float) and value != value):  # None, NaN
        return MISSING_TEXT
    if not isinstance(value, str):
        return f"not text (a {type(value).__name__})"
    if value == "":
        return MISSING_TEXT
    if not value.strip():
        return WHITESPACE_TEXT
    if _NUMBER_RE.match(value):
        return NUMBER_TEXT
    if not value.isascii():  # ASCII (a flag of the string) cannot hold surrogates
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return NOT_UNICODE
    return ""


def clean_text(text: str) -> str:
    """Turn ``<br />`` tags into line breaks, normalise Unicode to NFC and strip."""
    return unicodedata.normalize("NFC", _BREAK_RE.sub("\n", text)).strip()


def percentiles(values: np.ndarray) -> dict[str, float]:
    """p50/p90/p95/p99, min, max and mean of a length distribution (words or tokens)."""
    stats = {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 95, 99)}
    stats.update(min=int(values.min()), max=int(values.max()), mean=round(float(values.mean()), 1))
    return stats


def save_labels(directory: str | Path, labels: Sequence[str]) -> Path:
    return atomic_write_json(Path(directory) / LABELS_FILE, {"labels": list(labels)})


def load_labels(directory: str | Path) -> list[str]:
    """Class names saved beside a dataset or a tokenizer, in class-index order."""
    path = Path(directory) / LABELS_FILE
    if not path.is_file():
        raise MissingInputError(
            f"class names missing: {path} (outputs from before labels were saved: "
            "rerun `make ingest tokenize` and retrain)"
        )
    return list(json.loads(path.read_text())["labels"])
