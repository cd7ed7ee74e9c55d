"""Token rows as the model reads them, from ragged untruncated ids: ``[CLS]`` + the kept tokens + ``[PAD]``s
(:func:`pad_rows`) and the windows a long row is read in (:func:`window_offsets`). Pure NumPy, shared by both text
tokenizers, the token store's readers and the exported graph's checks.
"""

from __future__ import annotations

import numpy as np

from pipeline.text.conventions import CLS_ID, PAD_ID


def truncate_and_pad_rows(
    flat_ids: np.ndarray, row_splits: np.ndarray, max_sequence_length: int, truncation: str, head_tokens: int
) -> np.ndarray:
    """Many token rows at once (given as ragged ``flat_ids`` + ``row_splits``) -> ``[N, max_sequence_length]``.

    Each row becomes ``[CLS]`` + the kept tokens + ``[PAD]``s. ``head`` keeps the first tokens,
    ``tail`` the last, ``head_tail`` the first ``head_tokens`` and the last
    ``max_sequence_length - 1 - head_tokens``. Vectorised: no Python loop over rows.
    """
    row_splits = np.asarray(row_splits, dtype=np.int64)
    return pad_rows(
        np.asarray(flat_ids), row_splits[:-1], np.diff(row_splits), max_sequence_length, truncation, head_tokens
    )


def pad_rows(
    flat_ids: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    max_sequence_length: int,
    truncation: str,
    head_tokens: int,
    start_id: int = CLS_ID,
    end_id: int | None = None,
) -> np.ndarray:
    """:func:`truncate_and_pad_rows` for rows at any ``starts`` in ``flat_ids`` (not necessarily in order).

    Each row starts with ``start_id``; with an ``end_id`` (a pretrained preset's ``[SEP]``) that token follows the
    kept ones, which are then one fewer."""
    if truncation not in ("head", "tail", "head_tail"):
        raise ValueError(f"unknown truncation strategy {truncation!r}")
    starts, lengths = np.asarray(starts, dtype=np.int64)[:, None], np.asarray(lengths, dtype=np.int64)[:, None]
    budget = max_sequence_length - (1 if end_id is None else 2)
    kept = np.minimum(lengths, budget)
    columns = np.arange(budget)[None, :]
    if truncation == "head":
        source = columns
    elif truncation == "tail":
        source = lengths - kept + columns
    else:  # beyond the budget: the first head_tokens, then the row's last tokens
        source = np.where((lengths > budget) & (columns >= head_tokens), lengths - budget + columns, columns)
    ids = np.full((len(lengths), max_sequence_length), PAD_ID, dtype=np.int32)
    ids[:, 0] = start_id
    valid = columns < kept
    ids[:, 1 : 1 + budget][valid] = flat_ids[(starts + source)[valid]]
    if end_id is not None:
        ids[np.arange(len(ids)), 1 + kept[:, 0]] = end_id
    return ids


def window_offsets(lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(first token of each window, the row it belongs to) for rows of ``lengths`` tokens, in windows of ``size``.

    A row longer than ``size`` gets ``ceil(length / size)`` windows, evenly spaced from its first token to its last
    (consecutive windows overlap by less than ``size``; together they hold every token); a shorter row gets none.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets, owners = [], []
    for row in np.flatnonzero(lengths > size):
        count = -(-int(lengths[row]) // size)
        offsets.append(np.round(np.linspace(0, lengths[row] - size, count)).astype(np.int64))
        owners.append(np.full(count, row, dtype=np.int64))
    if not offsets:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(offsets), np.concatenate(owners)
