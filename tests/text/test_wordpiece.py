"""The pipeline's own WordPiece tokenizer (``pipeline.text.wordpiece``): truncation, padding, windows, the
fast paths against KerasHub's ids, save and load."""

import json
import random

import numpy as np
import pandas as pd
import pytest

from pipeline.config import load_config
from pipeline.stages.tokenize import vocabulary as tokenization
from pipeline.text import wordpiece as encoding
from pipeline.text.conventions import CLS_ID, PAD_ID, UNK_ID
from pipeline.text.wordpiece import (
    FAST_PATH_LETTERS,
    TokenizationSettings,
    WordPieceTextTokenizer,
    on_fast_path,
    text_ends,
)


@pytest.fixture(scope="module")
def small_encoder():
    rng = random.Random(0)
    words = ["good", "bad", "movie", "plot", "actors", "boring", "great", "ending", "the", "was"]
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(200)]
    config = load_config(
        None,
        [
            "tokenizer.vocabulary_size=120",
            "tokenizer.min_frequency=1",
            "tokenizer.max_sequence_length=16",
            "tokenizer.head_tokens=4",
        ],
    )
    vocabulary = tokenization.learn_vocabulary(texts, config.tokenizer)
    return WordPieceTextTokenizer(vocabulary, TokenizationSettings.from_config(config.tokenizer))


def test_vocabulary_starts_with_reserved_tokens(small_encoder):
    assert small_encoder.vocabulary[:4] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    assert small_encoder.vocabulary_size <= 120


def test_encoding_layout_and_determinism(small_encoder):
    texts = ["The movie was good", "bad plot " * 20, ""]
    first = small_encoder.encode(texts)
    assert first.shape == (3, 16) and first.dtype == np.int32
    np.testing.assert_array_equal(first, small_encoder.encode(texts))
    assert (first[:, 0] == CLS_ID).all()
    for row in first:
        pads = np.flatnonzero(row == PAD_ID)
        if len(pads):  # padding only at the end, one contiguous block
            assert (pads == np.arange(pads[0], len(row))).all()
    assert first[1].tolist().count(PAD_ID) == 0  # long text fills every position


def test_encoding_in_chunks_traces_the_tokenizer_once_and_matches_one_call(small_encoder, monkeypatch):
    """A chunked reader (make score) calls encode per chunk: the tokenizer graph must not be rebuilt each time."""
    monkeypatch.setattr(encoding, "_ENCODE_BATCH", 4)  # several batches per call, a short last one
    texts = [f"the movie was {'good ' * (i % 5)}{'bad ' * (i % 3)}" for i in range(23)]
    whole = small_encoder.encode(texts)
    chunks = np.concatenate([small_encoder.encode(texts[start : start + 7]) for start in range(0, 23, 7)])
    np.testing.assert_array_equal(whole, chunks)
    small_encoder.encode(pd.Series(texts[:3], index=[10, 11, 12]))  # a Series with its own index works too
    small_encoder.encode(["straße, ΣΑΣ", "the movie"] * 3)  # KerasHub's path (not ASCII) and the fast one
    assert small_encoder._tokenize.experimental_get_tracing_count() == 1
    assert small_encoder._tokenize_fast.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "<br /><br />"])
def test_empty_text_is_cls_plus_padding(small_encoder, text):
    row = small_encoder.encode([text])[0]
    assert row[0] == CLS_ID and (row[1:] == PAD_ID).all()


def test_detokenizing_gives_back_normalised_words(small_encoder):
    text = "The  MOVIE was<br />good"
    row = small_encoder.encode([text])[0]
    assert small_encoder.decode(row) == "the movie was good"


def test_save_load_round_trip_and_tamper_detection(small_encoder, tmp_path):
    small_encoder.save(tmp_path)
    loaded = WordPieceTextTokenizer.load(tmp_path)
    texts = ["good movie", "the ending was boring"]
    np.testing.assert_array_equal(loaded.encode(texts), small_encoder.encode(texts))
    vocabulary = tmp_path / "vocabulary.txt"
    vocabulary.write_text("\n".join(vocabulary.read_text().split("\n")[:-10]) + "\n")
    with pytest.raises(ValueError, match="vocabulary.txt does not match"):
        WordPieceTextTokenizer.load(tmp_path)


def test_encode_windows_gives_each_text_its_row_then_a_long_ones_windows(small_encoder):
    texts = [
        "good movie",
        " ".join(f"{w} {v}" for w, v in zip(["good", "bad", "the"] * 12, ["plot", "ending"] * 18)),
        "the ending was boring",
    ]
    ids, owner = small_encoder.encode_windows(texts)
    np.testing.assert_array_equal(ids[:3], small_encoder.encode(texts))  # the truncated rows first, in order
    assert owner[:3].tolist() == [0, 1, 2] and set(owner[3:].tolist()) == {1}
    whole = WordPieceTextTokenizer(small_encoder.vocabulary, TokenizationSettings(True, 200, "head_tail", 4)).encode(
        texts[1:2]
    )[0]
    whole = whole[1:][whole[1:] != PAD_ID]  # every token of the long text
    offsets, _ = encoding.window_offsets(np.array([len(whole)]), 15)
    assert len(ids) == 3 + len(offsets) > 4
    for row, offset in zip(ids[3:], offsets):
        assert row[0] == CLS_ID and row[1:].tolist() == whole[offset : offset + 15].tolist()


def test_the_encoder_file_holds_no_model_setting_and_an_old_one_with_long_reviews_still_loads(small_encoder, tmp_path):
    small_encoder.save(tmp_path)
    settings = tmp_path / "tokenizer.json"
    assert "long_reviews" not in json.loads(settings.read_text())  # a model setting: model_settings.json
    settings.write_text(
        json.dumps({**json.loads(settings.read_text()), "long_reviews": "windows"})
    )  # as trained before
    loaded = WordPieceTextTokenizer.load(tmp_path)
    assert loaded.settings == small_encoder.settings
    np.testing.assert_array_equal(loaded.encode(["a good movie"]), small_encoder.encode(["a good movie"]))


def test_load_missing_files_says_run_tokenize(tmp_path):
    with pytest.raises(FileNotFoundError, match="make tokenize"):
        WordPieceTextTokenizer.load(tmp_path)


# --------------------------------------------------------------------------- the exact shortcuts in ``encode``

ASCII_TEXT_CHARACTERS = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\r"]


@pytest.fixture(scope="module")
def character_encoder():
    """A vocabulary holding every printable ASCII character, as a word and as a ``##`` piece, a few words,
    and entries holding a space (KerasHub's learner keeps such NFKC forms): any difference in how the two
    tokenizers split or case ASCII text shows up as different ids."""
    printable = [chr(c) for c in range(0x21, 0x7F)]
    words = ["the", "movie", "was", "good", "bad", "don", "isn", "it", "##s", "##ing"]
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", " ", "## ", "don \u0301t"]
    vocabulary += printable + [f"##{c}" for c in printable if c.isalnum()] + words
    letters = sorted({c.lower() for c in FAST_PATH_LETTERS})  # a letter left unlowered would be [UNK]
    vocabulary += letters + [f"##{c}" for c in letters]
    vocabulary = list(dict.fromkeys(vocabulary))  # one id per entry
    settings = TokenizationSettings(lowercase=True, max_sequence_length=24, truncation="head_tail", head_tokens=5)
    return WordPieceTextTokenizer(vocabulary, settings)


def _untruncated(encoder, texts, fast):
    flat, starts, lengths = encoder._token_rows(texts, fast=fast)
    return [flat[start : start + length].tolist() for start, length in zip(starts, lengths)]


def test_fast_path_gives_keras_hub_ids_for_every_ascii_character_in_context(character_encoder):
    rng = random.Random(0)
    texts = [
        f"{left}{c}{right}"
        for c in ASCII_TEXT_CHARACTERS
        for left, right in (("", ""), ("a", "b"), ("The", "Movie"), ("x ", " y"), ("9", "9"), (c, c))
    ]
    texts += [
        "".join(rng.choice(ASCII_TEXT_CHARACTERS + list("aeiou  ")) for _ in range(rng.randint(0, 80)))
        for _ in range(400)
    ]
    texts += ["A" * 99 + " ok", "b" * 101 + " ok", "[CLS] [MASK] [UNK] [PAD]", "DON'T it's ISN'T", "don t"]
    texts += [
        f"{left}{c}{right}"
        for c in FAST_PATH_LETTERS  # the Latin letters that stay on it
        for left, right in (("", ""), ("a", "b"), ("The", "MOVIE"), ("x ", ". y"), (c, c))
    ]
    texts += ["Café CRÈME, naïve Ærø!", "ÉTÉ été"]
    assert all(on_fast_path(text) for text in texts)
    fast, reference = _untruncated(character_encoder, texts, True), _untruncated(character_encoder, texts, False)
    differing = [(text, got, want) for text, got, want in zip(texts, fast, reference) if got != want]
    assert not differing, differing[:5]
    assert any(UNK_ID in row for row in reference)  # the 101-byte word: both give [UNK]


@pytest.mark.parametrize(
    "text",
    [
        "café\u00a0crème",
        "x\u0085y",
        "\u0096dash",
        "Ωmega ΣΑΣ",
        "日本語 text",
        "don´t",
        "tab\x0bvertical",
        "nul\x00char",
        "ﬁne",
        "straße",
        "ĲSSEL",
        "ǅemal",
        "e\u0301",
    ],
)
def test_any_other_text_is_routed_to_keras_hub(character_encoder, text):
    assert not on_fast_path(text)
    np.testing.assert_array_equal(character_encoder.encode([text]), character_encoder.encode_reference([text]))


def test_text_ends_cut_at_spaces_and_never_overlap():
    text = "aa bb cc dd ee ff gg"
    head, tail = text_ends(text, 4, 4)
    assert (head, tail) == ("aa bb", "ff gg")  # the first space at or after 4 characters; the last before the end's 4
    assert text_ends(text, 10, 10) is None  # not longer than both ends together
    assert text_ends("a" * 30, 5, 5) is None  # no space to cut at
    assert text_ends(text, 0, 4) == ("", "ff gg") and text_ends(text, 4, 0) == ("aa bb", "")
    assert text_ends("aaaa bbbb", 4, 4) == ("aaaa", "bbbb")  # the only space is both cut points
    assert text_ends("aaaaaaaa bb", 4, 4) is None  # the end would need a space before "bb"


@pytest.mark.parametrize("strategy,head", [("head", 0), ("tail", 0), ("head_tail", 5), ("head_tail", 0)])
def test_encode_by_the_ends_gives_the_whole_text_ids(character_encoder, strategy, head, monkeypatch):
    """Long texts tokenized by their ends give exactly the ids of the whole text, including texts whose ends
    hold too few tokens (long words: one [UNK] per 101 characters), which are then tokenized whole."""
    from dataclasses import replace

    encoder = WordPieceTextTokenizer(
        character_encoder.vocabulary, replace(character_encoder.settings, truncation=strategy, head_tokens=head)
    )
    rng = random.Random(1)
    words = ["the", "movie", "was", "good,", "bad!", "It's", "DON'T", "x" * 101, "\t", "café"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(300)]
    texts += [" ".join(["y" * 101] * 30), "w " * 200, "  lead and trail  " * 20]
    calls = []
    token_rows = encoder._token_rows
    monkeypatch.setattr(
        encoder, "_token_rows", lambda batch, fast=True: calls.append(len(batch)) or token_rows(batch, fast)
    )
    got = encoder.encode(texts)
    assert len(calls) == 2  # the ends, then the whole texts whose ends held too few tokens
    monkeypatch.undo()
    np.testing.assert_array_equal(got, encoder.encode_reference(texts))
    lengths = encoder.encode_with_counts(texts)[1]
    assert (lengths > encoder.settings.max_sequence_length - 1).sum() > 100  # many texts were truncated


def test_the_fast_path_turns_itself_off_when_the_libraries_disagree(character_encoder, monkeypatch):
    """A probe the two tokenizers treat differently ("ß": KerasHub case-folds it to "ss") stands for a library
    version that splits or cases a fast-path character otherwise: the encoder warns and uses KerasHub only."""
    assert character_encoder.fast_path_agrees  # the installed versions agree on every probe
    monkeypatch.setattr(encoding, "fast_path_probes", lambda: ["the movie", "straße"])
    encoder = WordPieceTextTokenizer(character_encoder.vocabulary, character_encoder.settings)
    with pytest.warns(RuntimeWarning, match="1 of 2 probe texts .* every text goes through KerasHub"):
        assert not encoder.fast_path_agrees  # checked on first use
    calls = []
    token_rows = encoder._tokenize_fast
    monkeypatch.setattr(encoder, "_tokenize_fast", lambda batch: calls.append(batch) or token_rows(batch))
    texts = ["The movie was GOOD!", "the end " * 50]
    np.testing.assert_array_equal(encoder.encode(texts), encoder.encode_reference(texts))
    assert not calls
