"""Pre-tokenized texts: the untruncated WordPiece ids of given texts, made where TensorFlow is, read where it is not.

Tokenizing runs on TensorFlow (tf-text), which a GPU machine with JAX alone lacks. A token store, written on a machine
with TensorFlow (:func:`write_token_store`), holds every given text's untruncated ids for one tokenizer (its vocabulary
and case setting, :func:`tokenizer_identity`), keyed by a hash of the cleaned text. Point ``PIPELINE_TOKEN_STORE`` at
it and every ``WordPieceTextTokenizer`` of that vocabulary reads its ids from there: training's logged example,
evaluation, behaviour tests, scoring. The rows are untruncated, so truncation, head/tail cuts and windows are the
tokenizer's own arithmetic on them: the ids equal the tokenizer's (``tests/text/test_token_store.py``). A text the
store lacks is tokenized as usual where TensorFlow is installed, and is one error naming the store where it is not.
"""

from __future__ import annotations

import hashlib
import lzma
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import sha256_text

STORE_ENV = "PIPELINE_TOKEN_STORE"
FORMAT = "pipeline-token-store v1"
_LOADED: dict[tuple[str, float], TokenStore] = {}


def tokenizer_identity(vocabulary: Sequence[str], lowercase: bool) -> str:
    """What decides a text's untruncated ids: the vocabulary and the case setting."""
    return sha256_text(f"lowercase={lowercase}\n" + "".join(token + "\n" for token in vocabulary))


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class TokenStore:
    """One store file: the untruncated ids of cleaned texts for the tokenizer ``identity``."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise MissingInputError(f"{STORE_ENV}={path}: no such file (write one with `make gpu-check-bundle`)")
        with np.load(path, allow_pickle=False) as payload:
            if str(payload["format"]) != FORMAT:
                raise InputError(f"{path}: format {str(payload['format'])!r}, expected {FORMAT!r}")
            self.identity = str(payload["identity"])
            keys = payload["keys"]
            flat = lzma.decompress(payload["flat_xz"].tobytes())
            self.flat = np.frombuffer(flat, dtype=str(payload["flat_dtype"])).astype(np.int32)
            self.starts, self.lengths = payload["starts"], payload["lengths"]
        self.path = path
        self.index = {key.tobytes(): row for row, key in enumerate(keys)}

    def __len__(self) -> int:
        return len(self.index)

    def rows(self, texts: Sequence[str]) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray] | None, list[str]]:
        """((flat ids, row starts, row lengths) of ``texts``, or None; the texts it lacks)."""
        found = [self.index.get(text_key(text)) for text in texts]
        missing = [text for text, row in zip(texts, found) if row is None]
        if missing:
            return None, missing
        rows = np.asarray(found, dtype=np.int64)
        lengths = self.lengths[rows].astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        take = np.repeat(self.starts[rows] - starts, lengths) + np.arange(int(lengths.sum()))
        return (self.flat[take], starts, lengths), []


def active_store() -> TokenStore | None:
    """The store ``PIPELINE_TOKEN_STORE`` names (read once per file version), or None."""
    name = os.environ.get(STORE_ENV, "").strip()
    if not name:
        return None
    path = Path(name)
    key = (str(path.resolve()), path.stat().st_mtime if path.is_file() else 0.0)
    if key not in _LOADED:
        _LOADED[key] = TokenStore(path)
    return _LOADED[key]


def pretokenized(identity: str, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The stored rows of cleaned ``texts`` for the tokenizer ``identity``; None when there is no store, or when it
    cannot answer and TensorFlow can (the caller then tokenizes); an error when neither can."""
    store = active_store()
    if store is None:
        return None
    rows, missing = store.rows(texts) if store.identity == identity else (None, list(texts))
    if rows is not None:
        return rows
    try:
        import tensorflow  # noqa: F401  (the tokenizer's own engine answers what the store cannot)
    except ImportError:
        reason = (
            f"holds another vocabulary's tokens (tokenizer {store.identity[:12]}, this one {identity[:12]})"
            if store.identity != identity
            else f"lacks {len(missing):,} of these {len(texts):,} texts (first: {missing[0][:60]!r})"
        )
        raise InputError(
            f"tokenizing needs TensorFlow (tf-text), which this Python lacks, and the token store "
            f"{store.path} ({STORE_ENV}) {reason}: write a store of these texts where TensorFlow is "
            "(`make gpu-check-bundle`)"
        ) from None
    return None


def write_token_store(
    path: Path,
    identity: str,
    texts: Sequence[str],
    untruncated_rows: Callable[[list[str]], tuple[np.ndarray, np.ndarray, np.ndarray]],
    vocabulary_size: int,
    batch: int = 4096,
) -> int:
    """Tokenize the distinct cleaned ``texts`` with ``untruncated_rows`` and write the store to ``path`` atomically;
    returns the number of texts stored. The ids are uint16 when the vocabulary fits, xz-compressed (a quarter smaller
    than zlib on IMDB's ids: a store must fit what a GPU machine's call carries)."""
    distinct = list(dict.fromkeys(texts))
    keys: list[bytes] = []
    flats: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for start in range(0, len(distinct), batch):
        chunk = distinct[start : start + batch]
        flat, starts, counts = untruncated_rows(chunk)
        order = np.repeat(starts, counts) + (
            np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        )
        flats.append(flat[order])
        lengths.append(counts)
        keys.extend(text_key(text) for text in chunk)
    counts = np.concatenate(lengths).astype(np.int32) if lengths else np.zeros(0, np.int32)
    dtype = np.uint16 if vocabulary_size <= np.iinfo(np.uint16).max + 1 else np.int32
    flat = np.concatenate(flats).astype(dtype) if flats else np.zeros(0, dtype)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    packed = np.frombuffer(lzma.compress(flat.tobytes(), preset=9 | lzma.PRESET_EXTREME), np.uint8)
    np.savez_compressed(
        tmp,
        format=np.array(FORMAT),
        identity=np.array(identity),
        keys=np.frombuffer(b"".join(keys), np.uint8).reshape(-1, 16),
        flat_xz=packed,
        flat_dtype=np.array(np.dtype(dtype).name),
        starts=np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64),
        lengths=counts,
    )
    os.replace(tmp, path)
    return len(distinct)
