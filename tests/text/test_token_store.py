"""Pre-tokenized texts (``pipeline.text.token_store``): a store written with TensorFlow gives every encoding of the
tokenizer the same ids without it; a text it lacks, or another vocabulary's store, is one error naming the store where
TensorFlow is missing, and is tokenized as usual where it is not."""

import random
import sys

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.core.errors import InputError
from pipeline.stages.tokenize import vocabulary as tokenization
from pipeline.text.conventions import clean_text
from pipeline.text.token_store import STORE_ENV, tokenizer_identity, write_token_store
from pipeline.text.wordpiece import TokenizationSettings, WordPieceTextTokenizer
from tests.conftest import PROJECT_ROOT

TEXTS = [
    "The movie was GOOD!",
    "",
    "straße, ΣΑΣ and café",
    "bad plot " * 30,
    " ".join(f"{w} {v}" for w, v in zip(["good", "bad", "the"] * 12, ["plot", "ending"] * 18)),
    "dull<br />long",
]


def tokenizer(lowercase: bool = True, truncation: str = "head_tail") -> WordPieceTextTokenizer:
    rng = random.Random(0)
    words = ["good", "bad", "plot", "ending", "the", "movie", "was", "café", "straße", "dull", "long"]
    corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(200)]
    config = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [
            "tokenizer.vocabulary_size=80",
            "tokenizer.min_frequency=1",
            "tokenizer.max_sequence_length=16",
            "tokenizer.head_tokens=4",
            f"tokenizer.truncation={truncation}",
            f"tokenizer.lowercase={lowercase}",
        ],
    )
    return WordPieceTextTokenizer(
        tokenization.learn_vocabulary(corpus, config.tokenizer), TokenizationSettings.from_config(config.tokenizer)
    )


def write_store(text_tokenizer, path, texts=TEXTS):
    cleaned = [clean_text(text) for text in texts]
    return write_token_store(
        path, text_tokenizer.identity, cleaned, text_tokenizer.untruncated_rows, text_tokenizer.vocabulary_size, batch=4
    )


def without_tensorflow(monkeypatch, text_tokenizer):
    """A tokenizer whose TensorFlow tokenizers fail when called, in a process where ``import tensorflow`` fails."""

    def no_tensorflow(*_):
        raise AssertionError("TensorFlow tokenized a text the store holds")

    monkeypatch.setitem(sys.modules, "tensorflow", None)
    for name in ("_tokenize", "_tokenize_fast"):  # set on the instance, not built (they are cached properties)
        vars(text_tokenizer)[name] = no_tensorflow
    return text_tokenizer


@pytest.mark.parametrize("truncation", ["head", "tail", "head_tail"])
def test_stored_rows_give_every_encoding_the_tokenizers_own_ids(tmp_path, monkeypatch, truncation):
    reference = tokenizer(truncation=truncation)
    expected = (reference.encode(TEXTS), reference.encode_with_counts(TEXTS), reference.encode_windows(TEXTS))
    assert write_store(reference, tmp_path / "tokens.npz", TEXTS + TEXTS[:2]) == len(TEXTS)  # stored once each
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "tokens.npz"))
    stored = without_tensorflow(monkeypatch, tokenizer(truncation=truncation))
    np.testing.assert_array_equal(stored.encode(TEXTS), expected[0])
    ids, counts, unknown = stored.encode_with_counts(list(reversed(TEXTS)))
    np.testing.assert_array_equal(ids, expected[1][0][::-1])
    np.testing.assert_array_equal(counts, expected[1][1][::-1])
    assert unknown == expected[1][2]
    for got, want in zip(stored.encode_windows(TEXTS), expected[2]):
        np.testing.assert_array_equal(got, want)
    assert expected[2][0].shape[0] > len(TEXTS)  # the long texts have windows: whole rows were stored


def test_a_text_the_store_lacks_is_an_error_naming_the_store_without_tensorflow(tmp_path, monkeypatch):
    reference = tokenizer()
    write_store(reference, tmp_path / "tokens.npz")
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "tokens.npz"))
    with_tensorflow = tokenizer()
    np.testing.assert_array_equal(
        with_tensorflow.encode(["a text no store holds"]), reference.encode(["a text no store holds"])
    )  # TensorFlow answers
    stored, other = tokenizer(), tokenizer(lowercase=False)  # (learning a vocabulary needs TensorFlow)
    without_tensorflow(monkeypatch, stored)
    with pytest.raises(
        InputError,
        match=rf"token store {tmp_path}/tokens.npz \({STORE_ENV}\) lacks 1 of these 2 "
        r"texts \(first: 'a text no store holds'\)",
    ):
        stored.encode(["The movie was GOOD!", "a text no store holds"])
    without_tensorflow(monkeypatch, other)
    assert other.identity != reference.identity == tokenizer_identity(reference.vocabulary, True)
    with pytest.raises(InputError, match=r"holds another vocabulary's tokens"):
        other.encode(["The movie was GOOD!"])


def test_a_missing_store_file_names_the_variable(tmp_path, monkeypatch):
    from pipeline.core.errors import MissingInputError

    monkeypatch.setenv(STORE_ENV, str(tmp_path / "none.npz"))
    with pytest.raises(MissingInputError, match=rf"{STORE_ENV}=.*none.npz: no such file"):
        tokenizer().encode(["good"])
