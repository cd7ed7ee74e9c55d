"""What a text tokenizer is (:class:`TextTokenizer`: raw text -> padded token ids, saved beside them) and reading
whichever one the tokenize stage saved.

Two implement it: the pipeline's own WordPiece tokenizer (``pipeline.text.wordpiece.WordPieceTextTokenizer``) and a
pretrained preset's tokenizer (``pipeline.text.preset_tokenizer.PresetTextTokenizer``). Training, evaluation and every
scorer take either through this protocol.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.core.catalog import TOKENIZER_SETTINGS_FILE
from pipeline.text.preset_tokenizer import PRESET_FORMAT, PresetTextTokenizer
from pipeline.text.wordpiece import TokenizationSettings, WordPieceTextTokenizer


class TextTokenizer(Protocol):
    """Raw review text -> fixed-length token ids ``[N, settings.max_sequence_length]``, start token first."""

    settings: TokenizationSettings
    vocabulary: list[str]

    # read-only (properties): each implementation narrows them (a preset's is a ``str``, the pipeline's own ``None``)
    @property
    def preset(self) -> str | None:
        """The KerasHub preset whose tokenizer it is; None for the pipeline's own."""

    @property
    def tokenizer(self) -> object:
        """The KerasHub tokenizer layer that defines the ids (cleaned text -> ragged ids, in-graph)."""

    @property
    def start_id(self) -> int:
        """The first id of every row ([CLS])."""

    @property
    def end_id(self) -> int | None:
        """The id after the kept tokens (a preset's [SEP]); None for the pipeline's own."""

    @property
    def vocabulary_size(self) -> int: ...

    @property
    def can_mask(self) -> bool:
        """Whether masked-LM pretraining applies (a ``[MASK]`` token of the pipeline's own vocabulary)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_with_counts(self, texts: Sequence[str], fast: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
        """(ids, untruncated token counts, number of unknown tokens)."""

    def encode_reference(self, texts: Sequence[str]) -> np.ndarray:
        """``encode`` without shortcuts: what the fast paths are checked against."""

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: Path) -> None: ...


def load_text_tokenizer(directory: str | Path) -> TextTokenizer:
    """The text tokenizer saved in ``directory``: the pipeline's own WordPiece tokenizer, or a pretrained preset's
    tokenizer, whichever the tokenize stage wrote."""
    settings_path = Path(directory) / TOKENIZER_SETTINGS_FILE
    if settings_path.is_file():
        payload = json.loads(settings_path.read_text())
        if payload.get("format") == PRESET_FORMAT:
            return PresetTextTokenizer.load(directory, payload)
    return WordPieceTextTokenizer.load(directory)
