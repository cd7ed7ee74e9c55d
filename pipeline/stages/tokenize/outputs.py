"""The readers of ``make tokenize``'s outputs, one per output, for every stage downstream of it.

The encoder itself (vocabulary and settings) is read by ``pipeline.text.encoder.load_text_encoder``, which
also reads a preset's; the label names by ``pipeline.text.conventions.load_labels``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core.catalog import ids_file, labels_file


def load_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, labels) of one tokenized split, memory-mapped."""
    return (np.load(directory / ids_file(split), mmap_mode="r"),
            np.load(directory / labels_file(split), mmap_mode="r"))
