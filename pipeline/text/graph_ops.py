"""What ``make score`` does to a text before the model, as TensorFlow ops on a ``string[N]`` tensor of UTF-8 bytes.

Each function mirrors one Python function of the scoring path, and the export stage checks that they agree on the
test split before it writes anything (``pipeline.stages.export.check``):

- :func:`text_errors`: ``pipeline.text.conventions.text_problem`` (empty, whitespace-only, a number, not valid
  UTF-8), the same messages in the same order;
- :func:`clean_texts`: ``clean_text`` (``<br />`` to a line break, NFC, strip);
- :func:`padded_rows`: ``pipeline.text.wordpiece.pad_rows`` (start token, kept tokens by the truncation setting,
  end token, padding);
- :func:`window_rows` and :func:`pool_windows`: ``window_offsets`` / ``encode_windows`` and
  ``pipeline.core.predictions.pool_windows`` (a long review read whole, in windows).

Python's regular expressions and ``str.strip`` know Unicode whitespace and digits; RE2's ``\\s`` and ``\\d`` are
ASCII, so the patterns here spell Python's classes out (:func:`whitespace_class`, ``\\p{Nd}``).
"""

from __future__ import annotations

import functools

from pipeline.core.predictions import WINDOW_EPS
from pipeline.text.conventions import MISSING_TEXT, NOT_UNICODE, NUMBER_TEXT, PAD_ID, WHITESPACE_TEXT


@functools.cache
def whitespace_class() -> str:
    """An RE2 character class of exactly the characters Python's ``str.isspace`` (and ``re``'s ``\\s``) takes."""
    return "[" + "".join(f"\\x{{{code:x}}}" for code in range(0x110000) if chr(code).isspace()) + "]"


def text_errors(texts):
    """``string[N]``: why each text cannot be scored ("" when it can), as ``text_problem`` says it."""
    import tensorflow as tf

    space = whitespace_class()
    digits = "\\p{Nd}"
    number = f"{space}*[-+]?({digits}+\\.?{digits}*|\\.{digits}+)([eE][-+]?{digits}+)?{space}*"
    # valid UTF-8 is what survives decoding with replacement unchanged (surrogates encoded as bytes do not)
    valid = tf.equal(
        tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD), texts
    )
    errors = tf.where(valid, "", NOT_UNICODE)
    errors = tf.where(tf.strings.regex_full_match(texts, number), NUMBER_TEXT, errors)
    errors = tf.where(tf.strings.regex_full_match(texts, f"{space}*"), WHITESPACE_TEXT, errors)
    return tf.where(tf.equal(texts, ""), MISSING_TEXT, errors)


def clean_texts(texts):
    """``clean_text`` of each text: ``<br />`` tags to line breaks, Unicode NFC, whitespace stripped."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    space = whitespace_class()
    texts = tf.strings.regex_replace(texts, f"(?i)<br{space}*/?>", "\n")
    texts = tf_text.normalize_utf8(texts, "NFC")
    return tf.strings.regex_replace(texts, f"^{space}+|{space}+$", "")


def padded_rows(tokens, max_sequence_length: int, truncation: str, head_tokens: int, start_id: int, end_id: int | None):
    """``pad_rows`` of ragged ``tokens`` ``[N, None]``: int32 ``[N, width]``, where ``width`` is the longest row's
    (start and end tokens included): trailing padding changes no probability (the padding mask), so it is cut."""
    import tensorflow as tf

    lengths = tf.cast(tokens.row_lengths(), tf.int64)[:, None]
    starts = tf.cast(tokens.row_starts(), tf.int64)[:, None]
    flat = tf.concat([tf.cast(tokens.flat_values, tf.int32), [PAD_ID]], axis=0)  # a pad to gather for empty cells
    budget = max_sequence_length - (1 if end_id is None else 2)
    kept = tf.minimum(lengths, budget)
    columns = tf.range(budget, dtype=tf.int64)[None, :]
    if truncation == "head":
        source = columns + tf.zeros_like(lengths)
    elif truncation == "tail":
        source = lengths - kept + columns
    elif truncation == "head_tail":
        source = tf.where((lengths > budget) & (columns >= head_tokens), lengths - budget + columns, columns)
    else:
        raise ValueError(f"unknown truncation strategy {truncation!r}")
    valid = columns < kept
    body = tf.gather(flat, tf.where(valid, starts + source, tf.size(flat, tf.int64) - 1))
    if end_id is not None:  # one more column: the end token right after the kept ones
        body = tf.concat([body, tf.fill([tf.shape(body)[0], 1], PAD_ID)], axis=1)
        body = tf.where(tf.range(budget + 1, dtype=tf.int64)[None, :] == kept, end_id, body)
    ids = tf.concat([tf.fill([tf.shape(body)[0], 1], start_id), body], axis=1)
    width = tf.reduce_max(tf.concat([tf.reshape(kept, [-1]), [0]], 0)) + (1 if end_id is None else 2)
    return ids[:, :width]


def window_rows(tokens, max_sequence_length: int, start_id: int):
    """(int32 ids ``[M, max_sequence_length]``, int64 owner ``[M]``): ``encode_windows``'s windows of every text
    longer than the limit, ``ceil(length / size)`` of them evenly spaced from its first token to its last, each the
    start token and ``size = max_sequence_length - 1`` consecutive tokens (``window_offsets``, NumPy's ``linspace``
    then round half to even)."""
    import tensorflow as tf

    size = max_sequence_length - 1
    lengths = tf.cast(tokens.row_lengths(), tf.int64)
    counts = tf.where(lengths > size, (lengths + size - 1) // size, 0)
    steps = tf.ragged.range(counts)
    owner, step = steps.value_rowids(), steps.flat_values
    stop = tf.gather(lengths, owner) - size
    last = tf.gather(counts, owner) - 1
    spacing = tf.cast(stop, tf.float64) / tf.cast(tf.maximum(last, 1), tf.float64)
    offset = tf.where(step == last, stop, tf.cast(tf.round(tf.cast(step, tf.float64) * spacing), tf.int64))
    first = tf.gather(tf.cast(tokens.row_starts(), tf.int64), owner) + offset
    body = tf.gather(tf.cast(tokens.flat_values, tf.int32), first[:, None] + tf.range(size, dtype=tf.int64)[None, :])
    ids = tf.concat([tf.fill([tf.shape(body)[0], 1], start_id), body], axis=1)
    return ids, owner


def pool_windows(rows, windows, owner):
    """``pool_windows``: each text's probabilities ``rows`` ``[N, k]``, and where it has windows (``windows``
    ``[M, k]`` of text ``owner``), the softmax of the mean log-probability over its row and its windows."""
    import tensorflow as tf

    texts = tf.shape(rows, out_type=tf.int64)[0]
    logs = tf.math.log(tf.clip_by_value(tf.cast(tf.concat([rows, windows], 0), tf.float64), WINDOW_EPS, 1.0))
    owners = tf.concat([tf.range(texts, dtype=tf.int64), owner], axis=0)
    sums = tf.math.unsorted_segment_sum(logs, owners, texts)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(owners, tf.float64), owners, texts)
    pooled = tf.cast(tf.nn.softmax(sums / counts[:, None], axis=1), rows.dtype)
    return tf.where((counts > 1)[:, None], pooled, rows)
