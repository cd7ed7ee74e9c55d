"""The model's token rows from ragged ids (``pipeline.text.token_rows``): truncation, padding, start and end tokens,
and the windows of a long row."""

import numpy as np
import pytest

from pipeline.text.conventions import CLS_ID, PAD_ID
from pipeline.text.token_rows import pad_rows, truncate_and_pad_rows, window_offsets


def truncate_and_pad(token_ids, max_sequence_length: int, truncation: str, head_tokens: int) -> np.ndarray:
    """One row of :func:`truncate_and_pad_rows`, the shape these tests state their cases in."""
    token_ids = np.asarray(token_ids, dtype=np.int32)
    return truncate_and_pad_rows(
        token_ids, np.array([0, len(token_ids)]), max_sequence_length, truncation, head_tokens
    )[0]


@pytest.mark.parametrize(
    "strategy,head,expected",
    [
        ("head", 0, [CLS_ID, 10, 11, 12, 13, 14]),
        ("tail", 0, [CLS_ID, 15, 16, 17, 18, 19]),
        ("head_tail", 2, [CLS_ID, 10, 11, 17, 18, 19]),
        ("head_tail", 5, [CLS_ID, 10, 11, 12, 13, 14]),
        ("head_tail", 0, [CLS_ID, 15, 16, 17, 18, 19]),
    ],
)
def test_truncation_keeps_exactly_the_right_tokens(strategy, head, expected):
    tokens = list(range(10, 20))
    assert truncate_and_pad(tokens, 6, strategy, head).tolist() == expected


@pytest.mark.parametrize("strategy", ["head", "tail", "head_tail"])
def test_short_sequences_are_cls_then_tokens_then_padding(strategy):
    row = truncate_and_pad([7, 8, 9], 8, strategy, 2)
    assert row.tolist() == [CLS_ID, 7, 8, 9, PAD_ID, PAD_ID, PAD_ID, PAD_ID]
    assert row.dtype == np.int32


@pytest.mark.parametrize("length", [0, 1, 14, 15, 16, 29, 30, 31, 100, 451])
def test_windows_hold_every_token_once_spaced_evenly_and_only_of_long_rows(length):
    offsets, owners = window_offsets(np.array([3, length]), 15)
    assert (owners == 1).all()  # the 3-token row has none
    if length <= 15:
        assert len(offsets) == 0
        return
    assert len(offsets) == -(-length // 15) and offsets[0] == 0 and offsets[-1] == length - 15
    covered = np.zeros(length, bool)
    for offset in offsets:
        covered[offset : offset + 15] = True
    assert covered.all() and (np.diff(offsets) <= 15).all()
    assert np.ptp(np.diff(offsets)) <= 1  # evenly spaced (rounded)


@pytest.mark.parametrize("strategy", ["head", "tail", "head_tail"])
def test_vectorised_rows_match_a_row_by_row_reference(strategy):
    """The batch encoder against a plain reading of the rule, on rows shorter, equal and longer than the budget."""
    rng = np.random.default_rng(0)
    rows = [rng.integers(4, 100, n).tolist() for n in (0, 1, 5, 7, 8, 20, 3)]
    max_length, head = 8, 3  # budget 7
    expected = []
    for row in rows:
        if len(row) > 7:
            row = {"head": row[:7], "tail": row[-7:], "head_tail": row[:head] + row[-(7 - head) :]}[strategy]
        expected.append([CLS_ID] + row + [PAD_ID] * (7 - len(row)))
    splits = np.cumsum([0] + [len(r) for r in rows])
    flat = np.array([t for r in rows for t in r], dtype=np.int32)
    assert truncate_and_pad_rows(flat, splits, max_length, strategy, head).tolist() == expected


def test_rows_hold_the_start_token_the_kept_tokens_and_the_end_token():
    flat = np.arange(10, 30)  # two texts: 12 tokens (10..21) and 3 tokens (22..24); the rest unused
    starts, lengths = np.array([0, 12]), np.array([12, 3])
    rows = pad_rows(flat, starts, lengths, 8, "head_tail", 2, start_id=101, end_id=102)
    assert rows.tolist() == [
        [101, 10, 11, 18, 19, 20, 21, 102],  # head 2, tail 4: 6 = 8 - start - end
        [101, 22, 23, 24, 102, 0, 0, 0],
    ]
    no_end = pad_rows(flat, starts, lengths, 8, "head", 2, start_id=7, end_id=None)
    assert no_end.tolist() == [[7, 10, 11, 12, 13, 14, 15, 16], [7, 22, 23, 24, 0, 0, 0, 0]]
