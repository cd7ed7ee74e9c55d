"""A pretrained KerasHub preset's tokenizer (``model.preset``) as the pipeline's text encoder: finding and checking a
preset, loading its tokenizer, and :class:`PresetTextEncoder`, which saves it beside the tokenized ids so that a
trained model never needs the preset again. The backbone and the classifier on it: ``pipeline.model.presets``.

A preset is a KerasHub preset name (``bert_tiny_en_uncased``; downloaded once into KerasHub's cache, so it needs
the network the first time) or the folder ``keras_hub.models.Backbone.save_to_preset`` and
``Tokenizer.save_to_preset`` wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from pipeline.core.catalog import TOKENIZER_SETTINGS_FILE, VOCABULARY_FILE
from pipeline.core.errors import ConfigError, InputError, MissingInputError
from pipeline.core.files import atomic_write_json, sha256_text
from pipeline.text.conventions import PAD_ID, clean_text
from pipeline.text.wordpiece import EncoderSettings, pad_rows

PRESET_FORMAT = "keras-hub preset tokenizer v1"
PRESET_ASSETS_DIR = "preset_assets"  # the tokenizer's own files (a WordPiece vocabulary, BPE merges, ...)
_ENCODE_BATCH = 2048


# --------------------------------------------------------------------------- finding and checking a preset


# KerasHub's own handles for a checkpoint on a hub (its docs' way to name one): passed to it as the strings they are,
# never read as paths. Each hub's host, probed before a download is tried, and the variable that makes its client
# read its local cache only.
HANDLES = {"hf://": ("huggingface.co", "HF_HUB_OFFLINE"), "kaggle://": ("www.kaggle.com", "KAGGLEHUB_OFFLINE"),
           "modelscope://": ("www.modelscope.cn", None), "gs://": ("storage.googleapis.com", None)}
PROBE_SECONDS = 3.0


def is_handle(preset: str) -> bool:
    return preset.startswith(tuple(HANDLES))


def _is_folder_name(preset: str) -> bool:
    return not is_handle(preset) and (os.sep in preset or preset.startswith(".") or Path(preset).exists())


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def host_reachable(host: str, port: int = 443, timeout: float = PROBE_SECONDS) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def hub_access(preset: str) -> Iterator[bool]:
    """While KerasHub loads ``preset``: for a handle whose hub cannot be reached, its client reads its local cache
    only (no retries for minutes); yields whether the hub was reachable (True for anything but a handle)."""
    scheme = next((s for s in HANDLES if preset.startswith(s)), None)
    if scheme is None:
        yield True
        return
    host, offline_variable = HANDLES[scheme]
    online = host_reachable(host)
    saved = os.environ.get(offline_variable) if offline_variable else None
    if not online and offline_variable:
        os.environ[offline_variable] = "1"
    try:
        yield online
    finally:
        if offline_variable and not online:
            if saved is None:
                os.environ.pop(offline_variable, None)
            else:
                os.environ[offline_variable] = saved


def converted_architectures() -> list[str]:
    """The Hugging Face architectures KerasHub's transformers loader converts (its ``convert_<model_type>``
    modules)."""
    import pkgutil

    from keras_hub.src.utils import transformers as loaders

    return sorted(name.removeprefix("convert_") for _, name, _ in pkgutil.iter_modules(loaders.__path__)
                  if name.startswith("convert_"))


def check_convertible(folder: Path) -> None:
    """A Hugging Face checkpoint folder (``config.json`` with a ``model_type``) must be of an architecture KerasHub's
    transformers loader converts; a KerasHub preset folder passes."""
    from keras_hub.src.utils.transformers.preset_loader import TransformersPresetLoader

    config = json.loads((folder / "config.json").read_text())
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type is None or "registered_name" in config:
        return
    try:
        TransformersPresetLoader(str(folder), config)
    except ValueError:
        raise InputError(f"model.preset: {folder} is a Hugging Face checkpoint of model_type {model_type!r}, which "
                         f"KerasHub cannot convert; it converts {', '.join(converted_architectures())}") from None


def check_preset_location(preset: str) -> None:
    """A handle (``hf://``, ``kaggle://``: KerasHub's to resolve), a folder that holds a KerasHub preset or a Hugging
    Face checkpoint KerasHub converts, or a preset name KerasHub knows; anything else is an error naming
    ``model.preset``."""
    import keras_hub

    if is_handle(preset):
        return
    if _is_folder_name(preset):
        folder = Path(preset)
        if not folder.is_dir():
            raise MissingInputError(f"model.preset: no preset folder at {folder} (a KerasHub preset name, an hf:// or "
                                    "kaggle:// handle, or a folder: a KerasHub preset or a Hugging Face checkpoint)")
        if not (folder / "config.json").is_file():
            raise InputError(f"model.preset: {folder} is not a KerasHub preset or Hugging Face checkpoint "
                             "(no config.json)")
        check_convertible(folder)
    elif preset not in keras_hub.models.Backbone.presets:
        raise ConfigError(f"model.preset: {preset!r} is neither a folder, a handle (hf://, kaggle://) nor a KerasHub "
                          "preset name (keras_hub.models.Backbone.presets lists them)")


LICENCE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "NOTICE.txt", "NOTICE.md")


@dataclass(frozen=True)
class CheckpointOrigin:
    """Where a checkpoint came from and the licence it states, for the model card."""

    source: str                     # what kind of name the user gave, in words
    licence: str                    # as the checkpoint's folder states it, or where to read it
    licence_files: tuple[Path, ...]  # its LICENSE / NOTICE files, which travel with a model made from it


def _stated_licence(folder: Path) -> str | None:
    """The licence a checkpoint folder states: its model card's ``license:`` (Hugging Face's front matter), else its
    LICENSE file's title (its first two non-empty lines)."""
    readme = folder / "README.md"
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        front = text.split("---")[1] if text.startswith("---") and text.count("---") >= 2 else ""
        for line in front.splitlines():
            if line.strip().lower().startswith("license:"):
                return line.split(":", 1)[1].strip()
    for name in LICENCE_FILES[:3]:
        if (folder / name).is_file():
            lines = [line.strip() for line in (folder / name).read_text(errors="replace").splitlines() if line.strip()]
            return " ".join(lines[:2]) or None
    return None


def checkpoint_origin(preset: str) -> CheckpointOrigin:
    """Where ``preset`` came from and its licence: a local folder's own statement (and its licence files); for a
    name or a handle, where the licence is published (the hub's model page), since nothing local states it."""
    if is_handle(preset):
        return CheckpointOrigin(f"the hub handle {preset}", "as published on the model's hub page", ())
    if not _is_folder_name(preset):
        return CheckpointOrigin(f"the KerasHub preset {preset} (downloaded from Kaggle or Hugging Face by KerasHub)",
                                "as published on the preset's Kaggle model page", ())
    folder = Path(preset)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    kind = ("a KerasHub preset folder" if "registered_name" in config
            else f"a Hugging Face checkpoint folder ({config.get('model_type', 'unknown')} architecture, converted by "
                 "KerasHub)")
    files = tuple(folder / name for name in LICENCE_FILES if (folder / name).is_file())
    return CheckpointOrigin(kind, _stated_licence(folder) or "not stated in the folder", files)


def load_failed(preset: str, part: str, error: Exception, reachable: bool = True) -> InputError:
    if not reachable:
        return InputError(f"model.preset: could not load the {part} of {preset!r}: its hub cannot be reached from "
                          "here and the handle is not in the local cache; download it once with a network, or use "
                          "a local folder")
    if isinstance(error, (OSError, ConnectionError)) and not _is_folder_name(preset):  # requests' errors are OSErrors
        return InputError(f"model.preset: could not load the {part} of {preset!r} ({type(error).__name__}: "
                          f"{_first_line(error)}); a preset name needs the network once, or use a preset folder")
    return InputError(f"model.preset: could not load the {part} of {preset!r} ({_first_line(error)})")


def load_preset_tokenizer(preset: str):
    """The preset's KerasHub tokenizer; a preset without one is an error naming ``model.preset``."""
    import keras_hub

    check_preset_location(preset)
    with hub_access(preset) as reachable:
        try:
            return keras_hub.models.Tokenizer.from_preset(preset)
        except FileNotFoundError as error:  # KerasHub's word for a preset saved without its tokenizer
            if not reachable:
                raise load_failed(preset, "tokenizer", error, reachable) from None
            raise InputError(f"model.preset: {preset} has no tokenizer ({_first_line(error)}): the pipeline needs "
                             "the preset's own (Tokenizer.save_to_preset)") from None
        except Exception as error:  # a failed download (offline), a broken tokenizer file, another library's error
            raise load_failed(preset, "tokenizer", error, reachable) from None


def check_tokenizer(tokenizer, preset: str) -> None:
    """The special tokens the classifier needs: a start token for first-token pooling, padding at id 0 (the id
    the pipeline's batching and masks use)."""
    for name in ("start_token_id", "pad_token_id"):
        if getattr(tokenizer, name, None) is None:
            raise InputError(f"model.preset: the tokenizer of {preset!r} ({type(tokenizer).__name__}) has no "
                             f"{name.removesuffix('_id').replace('_', ' ')}")
    if tokenizer.pad_token_id != PAD_ID:
        raise InputError(f"model.preset: the tokenizer of {preset!r} pads with id {tokenizer.pad_token_id}; the "
                         f"pipeline pads with id {PAD_ID} (BERT, DistilBERT, ELECTRA and DeBERTa presets do)")


# --------------------------------------------------------------------------- the preset's tokenizer as text encoder


class PresetTextEncoder:
    """Raw text -> the preset tokenizer's ids, start token first, end token after the kept ones, padded.

    A :class:`pipeline.text.encoder.TextEncoder`, as the pipeline's own WordPiece encoder is, so training,
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
            batch = [clean_text(text) for text in texts[start:start + _ENCODE_BATCH]]
            ragged = self._tokenize(tf.constant(batch, dtype=tf.string))
            flat, splits = ragged.flat_values.numpy(), ragged.row_splits.numpy()
            lengths = np.diff(splits)
            # start token, the kept tokens, the end token when the preset has one, then padding (id 0: check_tokenizer)
            ids.append(pad_rows(flat, splits[:-1], lengths, s.max_sequence_length, s.truncation, s.head_tokens,
                                self.start_id, self.end_id))
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
        payload = {"format": PRESET_FORMAT, "preset": self.preset, **asdict(self.settings),
                   "tokenizer": keras.saving.serialize_keras_object(self.tokenizer),
                   "vocabulary_size": self.vocabulary_size, "vocabulary_sha256": sha256_text(vocabulary_text),
                   "assets_sha256": assets_checksum(assets)}
        atomic_write_json(directory / TOKENIZER_SETTINGS_FILE, payload)

    @classmethod
    def load(cls, directory: str | Path, payload: dict | None = None) -> "PresetTextEncoder":
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
        settings = EncoderSettings(**{k: payload[k] for k in EncoderSettings.__dataclass_fields__})
        return cls(tokenizer, settings, payload["preset"])


def assets_checksum(folder: Path) -> str:
    """sha256 over the names and contents of the files in ``folder``."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
