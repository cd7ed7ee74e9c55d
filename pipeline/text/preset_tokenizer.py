"""A pretrained KerasHub preset's tokenizer (``model.preset``) as the pipeline's text tokenizer: loading and checking
it, and :class:`PresetTextTokenizer`, which saves it beside the tokenized ids so that a trained model never needs the
preset again. Where a preset lives: ``pipeline.core.checkpoints``; its backbone under the pipeline's classifier:
``pipeline.model.preset_classifier``.

A preset is a KerasHub preset name (``bert_tiny_en_uncased``; downloaded once into KerasHub's cache, so it needs
the network the first time) or the folder ``keras_hub.models.Backbone.save_to_preset`` and
``Tokenizer.save_to_preset`` wrote.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from pipeline.core.catalog import TOKENIZER_SETTINGS_FILE, VOCABULARY_FILE
from pipeline.core.checkpoints import check_preset_location, first_line, hub_access, load_failed, reachable_preset
from pipeline.core.errors import ConfigError, InputError, MissingInputError
from pipeline.core.files import atomic_write_json, sha256_text
from pipeline.text.conventions import PAD_ID, clean_text
from pipeline.text.token_rows import pad_rows
from pipeline.text.wordpiece import TokenizationSettings

PRESET_FORMAT = "keras-hub preset tokenizer v1"
PRESET_ASSETS_DIR = "preset_assets"  # the tokenizer's own files (a WordPiece vocabulary, BPE merges, ...)
_ENCODE_BATCH = 2048


def load_preset_tokenizer(preset: str):
    """The preset's KerasHub tokenizer; a preset without one is an error naming ``model.preset``."""
    import keras_hub

    preset = reachable_preset(preset)  # offline: the installed folder of an hf:// checkpoint, when there is one
    check_preset_location(preset)
    with hub_access(preset) as reachable:
        try:
            return keras_hub.models.Tokenizer.from_preset(preset)
        except FileNotFoundError as error:  # KerasHub's word for a preset saved without its tokenizer
            if not reachable:
                raise load_failed(preset, "tokenizer", error, reachable) from None
            raise InputError(
                f"model.preset: {preset} has no tokenizer ({first_line(error)}): the pipeline needs "
                "the preset's own (Tokenizer.save_to_preset)"
            ) from None
        except Exception as error:  # a failed download (offline), a broken tokenizer file, another library's error
            raise load_failed(preset, "tokenizer", error, reachable) from None


def check_tokenizer(tokenizer, preset: str) -> None:
    """The special tokens the classifier needs: a start token for first-token pooling, padding at id 0 (the id
    the pipeline's batching and masks use)."""
    for name in ("start_token_id", "pad_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise InputError(
                f"model.preset: the tokenizer of {preset!r} ({type(tokenizer).__name__}) has no "
                f"{name.removesuffix('_id').replace('_', ' ')}"
            )
    if tokenizer.pad_token_id != PAD_ID:
        raise InputError(
            f"model.preset: the tokenizer of {preset!r} pads with id {tokenizer.pad_token_id}; the "
            f"pipeline pads with id {PAD_ID} (BERT, DistilBERT, ELECTRA and DeBERTa presets do)"
        )


def preset_text_tokenizer(preset: str, settings, backbone) -> PresetTextTokenizer:
    """The text tokenizer of ``preset`` for the tokenize stage: its tokenizer, checked against ``backbone`` (the
    preset's network, loaded without weights for its limits), with the pipeline's length and truncation settings
    (``tokenizer.max_sequence_length`` at most the backbone's own limit)."""
    tokenizer = load_preset_tokenizer(preset)
    limit = getattr(backbone, "max_sequence_length", None)
    if limit is not None and settings.max_sequence_length > limit:
        raise ConfigError(
            f"tokenizer.max_sequence_length is {settings.max_sequence_length}, but {preset!r} takes "
            f"at most {limit} tokens"
        )
    if backbone.vocabulary_size != tokenizer.vocabulary_size():
        raise InputError(
            f"model.preset: {preset!r}'s tokenizer has {tokenizer.vocabulary_size()} tokens, its "
            f"backbone {backbone.vocabulary_size}"
        )
    return PresetTextTokenizer(tokenizer, settings, preset)


# --------------------------------------------------------------------------- the preset's tokenizer as text tokenizer


class PresetTextTokenizer:
    """Raw text -> the preset tokenizer's ids, start token first, end token after the kept ones, padded.

    A :class:`pipeline.text.text_tokenizer.TextTokenizer`, as the pipeline's own WordPiece tokenizer is, so training,
    evaluation and every scorer take either.
    """

    can_mask = False  # masked-LM pretraining of the pipeline's own encoder does not apply

    def __init__(self, tokenizer, settings, preset: str):
        import tensorflow as tf

        check_tokenizer(tokenizer, preset)
        self.tokenizer, self.settings, self.preset = tokenizer, settings, preset
        self.vocabulary = list(tokenizer.get_vocabulary())
        self.start_id, self.pad_id = int(tokenizer.start_token_id), int(tokenizer.pad_token_id)
        end = getattr(tokenizer, "end_token_id", None)
        self.end_id = None if end is None else int(end)
        oov = getattr(tokenizer, "oov_token", None) or getattr(tokenizer, "unknown_token", None)
        self.unknown_id = tokenizer.token_to_id(oov) if oov in self.vocabulary else None
        self._tokenize = tf.function(tokenizer, input_signature=[tf.TensorSpec([None], tf.string)])

    @property
    def vocabulary_size(self) -> int:
        return len(self.vocabulary)

    def encode_with_counts(self, texts: Sequence[str], fast: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
        """(ids ``[N, max_sequence_length]``, untruncated token counts, number of unknown tokens)."""
        import tensorflow as tf

        texts = texts if isinstance(texts, list) else list(texts)
        s = self.settings
        ids, counts, unknown = [], [], 0
        for start in range(0, len(texts), _ENCODE_BATCH):
            batch = [clean_text(text) for text in texts[start : start + _ENCODE_BATCH]]
            ragged = self._tokenize(tf.constant(batch, dtype=tf.string))
            flat, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
            lengths = np.diff(splits)
            # start token, the kept tokens, the end token when the preset has one, then padding (id 0: check_tokenizer)
            ids.append(
                pad_rows(
                    flat,
                    splits[:-1],
                    lengths,
                    s.max_sequence_length,
                    s.truncation,
                    s.head_tokens,
                    self.start_id,
                    self.end_id,
                )
            )
            counts.append(lengths.astype(np.int32))
            unknown += 0 if self.unknown_id is None else int((flat == self.unknown_id).sum())
        if not ids:
            return np.zeros((0, s.max_sequence_length), np.int32), np.zeros(0, np.int32), 0
        return np.concatenate(ids).astype(np.int32), np.concatenate(counts), unknown

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """The model input for ``texts``: int32 ``[N, max_sequence_length]``."""
        return self.encode_with_counts(texts)[0]

    encode_reference = encode

    def decode(self, ids: Sequence[int]) -> str:
        special = {self.start_id, self.pad_id, self.end_id}
        return " ".join(self.vocabulary[i] for i in ids if i not in special).replace(" ##", "")

    def save(self, directory: Path) -> None:
        """``vocabulary.txt`` (for people and checksums), the tokenizer's own files in ``preset_assets/`` and
        ``tokenizer.json``: its KerasHub config (without the vocabulary), the encoding settings, the checksums."""
        import keras

        assets = directory / PRESET_ASSETS_DIR
        assets.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_assets(str(assets))
        vocabulary_text = "".join(token + "\n" for token in self.vocabulary)
        (directory / VOCABULARY_FILE).write_text(vocabulary_text, encoding="utf-8")
        payload = {
            "format": PRESET_FORMAT,
            "preset": self.preset,
            **asdict(self.settings),
            "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
            "vocabulary_size": self.vocabulary_size,
            "vocabulary_sha256": sha256_text(vocabulary_text),
            "assets_sha256": assets_checksum(assets),
        }
        atomic_write_json(directory / TOKENIZER_SETTINGS_FILE, payload)

    @classmethod
    def load(cls, directory: str | Path, payload: dict | None = None) -> PresetTextTokenizer:
        """Load a saved preset tokenizer (no network, no preset cache); edited files are an error."""
        import keras

        directory = Path(directory)
        settings_path, assets = directory / TOKENIZER_SETTINGS_FILE, directory / PRESET_ASSETS_DIR
        payload = payload or json.loads(settings_path.read_text())
        if not assets.is_dir():
            raise MissingInputError(f"tokenizer files missing: {assets}/ (rerun `make tokenize`)")
        if assets_checksum(assets) != payload["assets_sha256"]:
            raise InputError(f"{assets}/ does not match {settings_path} (edited? rerun `make tokenize FORCE=1`)")
        tokenizer = keras.saving.deserialize_keras_object(payload["tokenizer"])
        tokenizer.load_assets(str(assets))
        settings = TokenizationSettings(**{k: payload[k] for k in TokenizationSettings.__dataclass_fields__})
        return cls(tokenizer, settings, payload["preset"])


def assets_checksum(folder: Path) -> str:
    """sha256 over the names and contents of the files in ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
