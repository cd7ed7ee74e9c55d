"""A tiny pretrained KerasHub preset, written locally: what `model.preset` reads, for the tests and for trying the
preset path on a machine that cannot download one.

    python -m tests.tiny_preset /tmp/tiny_bert_preset
    make all CONFIG=configs/smoke.yaml SET='model.preset=/tmp/tiny_bert_preset model.ngram_max=1'
"""

from __future__ import annotations

import sys
from pathlib import Path


def write_tiny_preset(folder: Path, with_tokenizer: bool = True, seed: int = 0, max_sequence_length: int = 64) -> Path:
    """A two-block ``BertBackbone`` (width 16) and its ``BertTokenizer``, saved as a KerasHub preset folder: what
    ``model.preset`` reads, built here since this machine cannot download one. The vocabulary covers the generated
    reviews' words (plus a few word pieces), so the tests' data tokenizes with few unknown tokens."""
    import keras
    import keras_hub

    from tests.conftest import NEGATIVE_WORDS, NEUTRAL_WORDS, POSITIVE_WORDS  # the generated reviews' words

    keras.utils.set_random_seed(seed)
    words = sorted({*POSITIVE_WORDS, *NEGATIVE_WORDS, *NEUTRAL_WORDS})
    vocabulary = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        ".",
        ",",
        "!",
        "'",
        "br",
        "<",
        ">",
        "/",
        *words,
        "##s",
        "##ed",
        "##ing",
        "##ly",
    ]
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=max_sequence_length,
    )
    backbone.save_to_preset(str(folder))
    if with_tokenizer:
        keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True).save_to_preset(str(folder))
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.tiny_preset FOLDER")
    print(f"wrote a tiny BERT preset to {write_tiny_preset(Path(sys.argv[1]))}/")
