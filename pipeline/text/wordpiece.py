"""The WordPiece tokenizer: raw review text -> fixed-length token ids, with the saved vocabulary.

:class:`WordPieceTextTokenizer` is the one path from raw text to model input; training, evaluation,
scoring and the MLflow pyfunc model all use it with the vocabulary the tokenize stage
learned (``pipeline/stages/tokenize/vocabulary.py``). It saves itself as ``vocabulary.txt`` and
``tokenizer.json`` (encoding settings and the vocabulary checksum) and loads back from them.

KerasHub's ``WordPieceTokenizer`` defines the ids (``encode_reference``); ``encode`` gives the
same ids faster through two exact shortcuts, described on the class.
"""

from __future__ import annotations

import json
import re
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeline.config import TokenizerConfig
from pipeline.core.catalog import TOKENIZER_SETTINGS_FILE, VOCABULARY_FILE
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import atomic_write_json, sha256_text
from pipeline.text.conventions import CLS_ID, MASK_ID, PAD_ID, REQUIRED_RESERVED, RESERVED_TOKENS, UNK_ID, clean_text
from pipeline.text.token_rows import pad_rows, window_offsets
from pipeline.text.token_store import active_store, pretokenized, tokenizer_identity

SETTINGS_FORMAT = "pipeline-wordpiece v1"
_ENCODE_BATCH = 2048
_FAST_PATH_CHECKED: dict[str, bool] = {}  # the fast-path check's answers in this process (_check_fast_path)
# A text takes the fast path (see ``WordPieceTextTokenizer``) when it holds only printable ASCII, tab, line feed,
# carriage return and the Latin letters below; any other character sends it through KerasHub.
_ASCII_TEXT_BYTES = bytes([9, 10, 13, *range(0x20, 0x7F)])


def _keeps_its_word(letter: str) -> bool:
    """A letter whose lowercase is one letter that NFKC and case folding leave alone (not "ß", "ĳ", "ǅ")."""
    lower = letter.lower()
    return (
        unicodedata.category(letter).startswith("L")
        and len(lower) == 1
        and unicodedata.normalize("NFKC", lower) == lower
        and letter.casefold() == lower
    )


FAST_PATH_LETTERS = "".join(
    chr(c) for c in range(0xC0, 0x250) if _keeps_its_word(chr(c))
)  # Latin-1 to Latin Extended-B
_OUTSIDE_FAST_PATH = re.compile(f"[^\\x20-\\x7e\\t\\n\\r{re.escape(FAST_PATH_LETTERS)}]")


def fast_path_probes() -> list[str]:
    """One short text per character the fast path takes, at a word's start, middle and end, doubled, next
    to capitals, digits, punctuation and whitespace, and a word past the 100-byte limit."""
    characters = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\r"] + list(FAST_PATH_LETTERS)
    return [f"{c}ab{c}Cd {c}{c} 9{c}. x{c}\n" for c in characters] + ["y" * 101 + " Ok"]


def on_fast_path(text: str) -> bool:
    """Whether ``text`` goes through the fast tokenizer (91 % of IMDB reviews are ASCII; with the Latin
    letters, 96 %)."""
    if text.isascii():  # a flag of the string object; then one C pass deleting the allowed bytes
        return not text.encode("ascii").translate(None, _ASCII_TEXT_BYTES)
    return not _OUTSIDE_FAST_PATH.search(text)


# ``encode`` tokenizes only a long text's ends: its first head_tokens * this many characters and last
# tail_tokens * this many (cut at spaces), and the whole text when they turn out to hold too few tokens.
# IMDB reviews have 4.5 characters per token (median; 3.7 at the 1st percentile).
CHARS_PER_TOKEN_BOUND = 5


# --------------------------------------------------------------------------- pure functions


def kept_ends(settings: TokenizationSettings) -> tuple[int, int]:
    """(tokens kept from a long text's start, tokens kept from its end) under the truncation setting."""
    budget = settings.max_sequence_length - 1
    return {
        "head": (budget, 0),
        "tail": (0, budget),
        "head_tail": (settings.head_tokens, budget - settings.head_tokens),
    }[settings.truncation]


def text_ends(text: str, head_chars: int, tail_chars: int) -> tuple[str, str] | None:
    """A long text's first ``head_chars``+ and last ``tail_chars``+ characters, cut at spaces; None when short.

    Both tokenizers split words at a space and drop it, so the tokens of ``text[:a]`` (``text[a]`` a
    space) are the first tokens of ``text``, and those of ``text[b + 1:]`` (``text[b]`` a space) its last
    ones. The two parts never overlap (``a <= b``). An end that is not wanted (0 characters) is "".
    """
    if len(text) <= head_chars + tail_chars:
        return None
    a = text.find(" ", head_chars) if head_chars else 0
    b = text.rfind(" ", 0, len(text) - tail_chars) if tail_chars else len(text)
    if a < 0 or b < a:
        return None
    return text[:a], text[b + 1 :]


@dataclass(frozen=True)
class TokenizationSettings:
    """Everything besides the vocabulary that decides how text becomes ids."""

    lowercase: bool
    max_sequence_length: int
    truncation: str
    head_tokens: int

    @classmethod
    def from_config(cls, config: TokenizerConfig) -> TokenizationSettings:
        return cls(config.lowercase, config.max_sequence_length, config.truncation, config.head_tokens)


class WordPieceTextTokenizer:
    """Raw review text -> ``[CLS]``-prefixed, padded WordPiece ids, with a saved vocabulary.

    KerasHub's ``WordPieceTokenizer`` defines the ids. Two exact shortcuts make ``encode`` faster
    (both checked in tests and by ``make bench`` on the real reviews, which counts rows that differ):

    - **ASCII texts** (only printable ASCII, tab, line feed, carriage return: 91 % of IMDB reviews), also
      with Latin letters that case folding leaves whole (:func:`on_fast_path`; 96 % of IMDB reviews), go
      through tensorflow-text's ``FastWordpieceTokenizer`` in end-to-end mode after ``str.lower()``,
      faster (docs/throughput.md). On such text KerasHub's steps (spaces around CJK characters, a split at
      whitespace, control characters and punctuation that keeps the punctuation, Unicode case folding,
      word pieces) come down to ASCII lowercasing and BERT's split at whitespace and punctuation, which
      that tokenizer does in one pass. KerasHub's learner keeps a few vocabulary entries that hold a
      space (NFKC folding turns "´" into " ́"); no KerasHub word holds whitespace, so they are never
      produced, and the fast tokenizer gets unreachable placeholders in their place, ids unchanged.
      Any other text goes through KerasHub.
    - **Long texts** (``encode`` only): truncation keeps a text's first and/or last tokens, so only its
      ends are tokenized (:func:`text_ends`), and the whole text when an end holds too few tokens.
      ``encode_with_counts`` tokenizes whole texts, since it reports every text's full length.
    """

    preset = None  # the pipeline's own, not a KerasHub preset's
    start_id, end_id = CLS_ID, None  # rows start with [CLS]; no end token

    def __init__(self, vocabulary: Sequence[str], settings: TokenizationSettings):
        if tuple(vocabulary[:REQUIRED_RESERVED]) != RESERVED_TOKENS[:REQUIRED_RESERVED]:
            raise InputError(
                f"vocabulary must start with {RESERVED_TOKENS}, got {tuple(vocabulary[:REQUIRED_RESERVED])}"
            )
        self.vocabulary = list(vocabulary)
        self.settings = settings
        self.identity = tokenizer_identity(self.vocabulary, settings.lowercase)  # a token store's key

    # TensorFlow's parts are built on first use, so that a tokenizer whose texts a token store holds
    # (pipeline.text.token_store) runs where TensorFlow is not installed; eagerly (tf.init_scope) also when first
    # used while a graph is traced (the exported model's), since their vocabulary tensors must outlive that graph

    @cached_property
    def tokenizer(self):
        import keras_hub
        import tensorflow as tf

        with tf.init_scope():
            return keras_hub.tokenizers.WordPieceTokenizer(
                vocabulary=self.vocabulary, lowercase=self.settings.lowercase, oov_token="[UNK]", dtype="int32"
            )

    @cached_property
    def fast_tokenizer(self):
        import tensorflow as tf
        import tensorflow_text as tf_text

        reachable = [
            token if not re.search(r"\s", token) else f"[unreachable {index}]"
            for index, token in enumerate(self.vocabulary)
        ]
        with tf.init_scope():
            return tf_text.FastWordpieceTokenizer(
                vocab=reachable,
                suffix_indicator="##",
                unknown_token="[UNK]",
                token_out_type=tf.int32,
                no_pretokenization=False,
                support_detokenization=False,
            )

    # each tokenizer as one tf.function, traced once per tokenizer (any batch size): a ``tf.data`` map would
    # trace it again on every call, which costs more than a chunked reader's (make score) tokenizing
    @cached_property
    def _tokenize(self):
        import tensorflow as tf

        return tf.function(self.tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])

    @cached_property
    def _tokenize_fast(self):
        import tensorflow as tf

        return tf.function(self.fast_tokenizer.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])

    @cached_property
    def fast_path_agrees(self) -> bool:
        return self._check_fast_path()

    def _check_fast_path(self) -> bool:
        """Whether the installed tensorflow-text and KerasHub agree on every character the fast path takes.

        Each such character is tokenized both ways in a short probe text (about 480 texts, a few
        milliseconds once both tokenizers are traced). A library version that splits or cases one of them
        differently turns the fast path off with a warning: every text then goes through KerasHub, slower and
        with the same ids. The answer is kept for the process, per vocabulary, case setting and probe set: a
        comparison loads the same tokenizer a dozen times, and tracing KerasHub's for the check cost about
        0.4 s each time.
        """
        import tensorflow as tf

        probes = fast_path_probes()
        key = sha256_text("\n".join([str(self.settings.lowercase), *self.vocabulary, "", *probes]))
        if key in _FAST_PATH_CHECKED:
            return _FAST_PATH_CHECKED[key]
        with tf.init_scope():
            fast = self._tokenize_fast(tf.constant([p.lower() if self.settings.lowercase else p for p in probes]))
            reference = self._tokenize(tf.constant(probes))
        fast_rows, reference_rows = fast.to_list(), reference.to_list()
        differing = [probe for probe, a, b in zip(probes, fast_rows, reference_rows) if a != b]
        if differing:
            warnings.warn(
                f"tokenizer: tensorflow-text's FastWordpieceTokenizer and KerasHub give other ids for "
                f"{len(differing)} of {len(probes)} probe texts (first: {differing[0]!r}); every text "
                "goes through KerasHub (same ids, slower)",
                RuntimeWarning,
                stacklevel=3,
            )
        _FAST_PATH_CHECKED[key] = not differing
        return not differing

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    @property
    def can_mask(self) -> bool:
        """Whether the vocabulary has ``[MASK]`` at its reserved id (needed for pretraining)."""
        return len(self.vocabulary) > MASK_ID and self.vocabulary[MASK_ID] == RESERVED_TOKENS[MASK_ID]

    def _token_rows(self, texts: list[str], fast: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat ids, row starts, row lengths) of the untruncated WordPiece ids of cleaned ``texts``.

        ``fast=False``: KerasHub for every text. Read from the token store when one holds them all.
        """
        stored = pretokenized(self.identity, texts)
        if stored is not None:
            return stored
        import tensorflow as tf

        fast = fast and self.fast_path_agrees
        on_fast = np.array([fast and on_fast_path(text) for text in texts], dtype=bool)
        starts, lengths = np.zeros(len(texts), np.int64), np.zeros(len(texts), np.int64)
        flats, offset = [], 0
        for rows, tokenize, lower in (
            (np.flatnonzero(on_fast), self._tokenize_fast, self.settings.lowercase),
            (np.flatnonzero(~on_fast), self._tokenize, False),
        ):
            if not len(rows):
                continue
            batch = [texts[i].lower() if lower else texts[i] for i in rows]
            ragged = tokenize(tf.constant(batch, dtype=tf.string))
            flat, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
            starts[rows], lengths[rows] = splits[:-1] + offset, np.diff(splits)
            flats.append(flat)
            offset += len(flat)
        return (np.concatenate(flats) if flats else np.zeros(0, np.int32)), starts, lengths

    def untruncated_rows(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat ids, row starts, row lengths) of cleaned ``texts``, untruncated: what a token store holds."""
        return self._token_rows(texts)

    def _pad(self, flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        s = self.settings
        return pad_rows(flat, starts, lengths, s.max_sequence_length, s.truncation, s.head_tokens)

    def encode_with_counts(self, texts: Sequence[str], fast: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
        """(ids ``[N, max_sequence_length]``, untruncated token counts, number of ``[UNK]`` tokens)."""
        texts = texts if isinstance(texts, list) else list(texts)
        ids, counts, unknown = [], [], 0
        for start in range(0, len(texts), _ENCODE_BATCH):
            flat, starts, lengths = self._token_rows(
                [clean_text(t) for t in texts[start : start + _ENCODE_BATCH]], fast
            )
            ids.append(self._pad(flat, starts, lengths))
            counts.append(lengths.astype(np.int32))
            unknown += int((flat == UNK_ID).sum())
        if not ids:
            return np.zeros((0, self.settings.max_sequence_length), np.int32), np.zeros(0, np.int32), 0
        return np.concatenate(ids), np.concatenate(counts), unknown

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """The model input for ``texts``: int32 ``[N, max_sequence_length]``."""
        if active_store() is not None:  # the store holds whole texts, not the ends the shortcut tokenizes
            return self.encode_with_counts(texts)[0]
        texts = texts if isinstance(texts, list) else list(texts)
        batches = [
            self._encode_batch([clean_text(t) for t in texts[start : start + _ENCODE_BATCH]])
            for start in range(0, len(texts), _ENCODE_BATCH)
        ]
        return np.concatenate(batches) if batches else np.zeros((0, self.settings.max_sequence_length), np.int32)

    def encode_windows(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids ``[M, max_sequence_length]``, the text each row belongs to ``[M]``): every text's ``encode`` row first,
        in order, then for each text longer than the limit its windows (:func:`window_offsets`): ``[CLS]`` and
        ``max_sequence_length - 1`` consecutive tokens each, together every token of the text."""
        texts = texts if isinstance(texts, list) else list(texts)
        size = self.settings.max_sequence_length - 1
        rows, windows, owners = [], [], []
        for start in range(0, len(texts), _ENCODE_BATCH):
            flat, starts, lengths = self._token_rows([clean_text(t) for t in texts[start : start + _ENCODE_BATCH]])
            rows.append(self._pad(flat, starts, lengths))
            offsets, owner = window_offsets(lengths, size)
            windows.append(pad_rows(flat, starts[owner] + offsets, np.full(len(owner), size), size + 1, "head", 0))
            owners.append(owner + start)
        if not rows:
            return np.zeros((0, size + 1), np.int32), np.zeros(0, np.int64)
        ids = np.concatenate(rows + windows)
        return ids, np.concatenate([np.arange(len(texts)), *owners])

    def encode_reference(self, texts: Sequence[str]) -> np.ndarray:
        """What ``encode`` returns, the plain way: KerasHub's tokenizer on every whole text (for checks)."""
        return self.encode_with_counts(texts, fast=False)[0]

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """``encode`` of cleaned texts: the long ones by their ends only (:func:`text_ends`)."""
        head, tail = kept_ends(self.settings)
        ends = [text_ends(text, head * CHARS_PER_TOKEN_BOUND, tail * CHARS_PER_TOKEN_BOUND) for text in texts]
        cut = np.flatnonzero([end is not None for end in ends])
        # a cut text's row holds its start (or, with no start kept, its end); with both kept, its end follows
        work = [text if end is None else end[0 if head else 1] for text, end in zip(texts, ends)]
        if head and tail:  # the cut texts' ends, in the order of ``cut``
            work += [end[1] for end in ends if end is not None]
        flat, starts, lengths = self._token_rows(work)
        ids = self._pad(flat, starts[: len(texts)], lengths[: len(texts)])
        if not len(cut):
            return ids
        tail_rows = len(texts) + np.arange(len(cut)) if head and tail else cut
        enough = (lengths[cut] >= head) & (lengths[tail_rows] >= tail)
        if head:  # the start's first tokens, then the end's last tokens: exactly the kept ones of the whole text
            ids[cut[enough], 1 : 1 + head] = flat[starts[cut[enough]][:, None] + np.arange(head)]
        if tail:
            last = starts[tail_rows[enough]] + lengths[tail_rows[enough]] - tail
            ids[cut[enough], 1 + head : 1 + head + tail] = flat[last[:, None] + np.arange(tail)]
        short = cut[~enough]  # an end with fewer tokens than kept: tokenize the whole text
        if len(short):
            ids[short] = self._pad(*self._token_rows([texts[i] for i in short]))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids back to text, dropping ``[CLS]`` and ``[PAD]`` and joining ``##`` word pieces."""
        pieces = [self.vocabulary[i] for i in ids if i not in (PAD_ID, CLS_ID)]
        text = " ".join(pieces)
        return text.replace(" ##", "")

    def save(self, directory: Path) -> None:
        vocabulary_text = "".join(token + "\n" for token in self.vocabulary)
        (directory / VOCABULARY_FILE).write_text(vocabulary_text, encoding="utf-8")
        payload = {
            "format": SETTINGS_FORMAT,
            **asdict(self.settings),
            "vocabulary_size": self.vocabulary_size,
            "vocabulary_sha256": sha256_text(vocabulary_text),
        }
        atomic_write_json(directory / TOKENIZER_SETTINGS_FILE, payload)

    @classmethod
    def load(cls, directory: str | Path) -> WordPieceTextTokenizer:
        """Load a saved tokenizer; a vocabulary edited or truncated since saving is an error."""
        directory = Path(directory)
        settings_path, vocabulary_path = directory / TOKENIZER_SETTINGS_FILE, directory / VOCABULARY_FILE
        for path in (settings_path, vocabulary_path):
            if not path.is_file():
                raise MissingInputError(f"tokenizer file missing: {path} (run `make tokenize` first)")
        payload = json.loads(settings_path.read_text())
        if payload.get("format") != SETTINGS_FORMAT:
            raise InputError(f"{settings_path}: format {payload.get('format')!r}, expected {SETTINGS_FORMAT!r}")
        vocabulary_text = vocabulary_path.read_text(encoding="utf-8")
        actual = sha256_text(vocabulary_text)
        if actual != payload["vocabulary_sha256"]:
            raise InputError(
                f"{vocabulary_path} does not match {settings_path}: sha256 {actual}, expected "
                f"{payload['vocabulary_sha256']} (edited or truncated? rerun `make tokenize FORCE=1`)"
            )
        vocabulary = vocabulary_text.split("\n")[:-1]
        if len(vocabulary) != payload["vocabulary_size"]:
            raise InputError(f"{vocabulary_path}: {len(vocabulary)} tokens, expected {payload['vocabulary_size']}")
        settings = TokenizationSettings(
            **{k: payload[k] for k in TokenizationSettings.__dataclass_fields__ if k in payload}
        )
        return cls(vocabulary, settings)
