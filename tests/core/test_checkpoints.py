"""Where a pretrained checkpoint lives (``pipeline.core.checkpoints``): every way a user names one reaches KerasHub
as it should, an unreachable hub is one error at once, a folder KerasHub cannot convert is refused, and the checkpoint's
origin and licence are read for the model card."""

import json

import keras_hub
import pytest

from pipeline.core import checkpoints
from pipeline.core.errors import InputError
from tests.tiny_preset import write_tiny_preset


@pytest.fixture(autouse=True)
def fresh_resolution():
    """Each test resolves handles anew (``reachable_preset`` answers once per process)."""
    checkpoints.reachable_preset.cache_clear()
    yield
    checkpoints.reachable_preset.cache_clear()


@pytest.mark.parametrize(
    "handle", ["hf://sentence-transformers/all-MiniLM-L6-v2", "kaggle://keras/bert/keras/bert_tiny_en_uncased/2"]
)
def test_a_handle_reaches_kerashub_as_the_string_it_is(handle, monkeypatch):
    """Not taken for a folder (``Path`` would make ``hf:/...`` of it): KerasHub's from_preset gets it unchanged."""
    from pipeline.core import checkpoints
    from pipeline.model.preset_classifier import load_preset_backbone

    asked = []

    def from_preset(preset, **kwargs):
        asked.append(preset)
        raise RuntimeError("stubbed download")

    monkeypatch.setattr(checkpoints, "host_reachable", lambda host, **kwargs: True)
    monkeypatch.setattr(keras_hub.models.Backbone, "from_preset", from_preset)
    with pytest.raises(InputError, match=f"could not load the backbone of '{handle}' \\(stubbed download\\)"):
        load_preset_backbone(handle)
    assert asked == [handle]


def test_a_handle_whose_hub_cannot_be_reached_is_one_error_naming_it_at_once(monkeypatch, tmp_path):
    import time

    from pipeline.core import checkpoints
    from pipeline.model.preset_classifier import load_preset_backbone

    monkeypatch.setattr(checkpoints, "host_reachable", lambda host, **kwargs: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-cache"))  # nothing cached
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.perf_counter()
    with pytest.raises(
        InputError,
        match="could not load the backbone of 'hf://sentence-transformers/paraphrase-MiniLM-L3-v2'"
        ": its hub cannot be reached from here",
    ):  # a checkpoint no installed package holds (all-MiniLM-L6-v2 offline is the installed folder: below)
        load_preset_backbone("hf://sentence-transformers/paraphrase-MiniLM-L3-v2", load_weights=False)
    assert time.perf_counter() - started < 10  # no retries for minutes
    assert "HF_HUB_OFFLINE" not in __import__("os").environ  # the client's offline switch is put back


def test_a_hugging_face_folder_of_an_architecture_kerashub_cannot_convert_is_one_error_naming_it(tmp_path):
    from pipeline.core.checkpoints import check_preset_location

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neo", "architectures": ["GPTNeoModel"]}))
    with pytest.raises(InputError, match=r"model_type 'gpt_neo', which KerasHub cannot convert; it converts .*bert"):
        check_preset_location(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    check_preset_location(str(tmp_path))  # an architecture KerasHub converts passes


def test_the_checkpoint_origin_names_its_kind_and_the_licence_its_folder_states(tmp_path):
    """A Hugging Face folder's model card front matter wins over its LICENSE file; a KerasHub preset folder says so;
    names and handles point at where their licence is published; a folder that states none says that."""
    from pipeline.core.checkpoints import checkpoint_origin

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "LICENSE").write_text("\n   MIT License\n\nCopyright (c) someone\n")
    origin = checkpoint_origin(str(folder))
    assert origin.source.startswith("a Hugging Face checkpoint folder (bert architecture")
    assert origin.licence == "MIT License Copyright (c) someone" and origin.licence_files == (folder / "LICENSE",)
    (folder / "README.md").write_text("---\nlanguage: en\nlicense: apache-2.0\n---\n# A model\n")
    assert checkpoint_origin(str(folder)).licence == "apache-2.0"
    preset = write_tiny_preset(tmp_path / "keras_hub_preset", with_tokenizer=False)
    assert checkpoint_origin(str(preset)).source == "a KerasHub preset folder"
    assert checkpoint_origin(str(preset)).licence == "not stated in the folder"
    assert "Kaggle model page" in checkpoint_origin("bert_tiny_en_uncased").licence
    assert checkpoint_origin("hf://sentence-transformers/all-MiniLM-L6-v2").source.startswith("the hub handle hf://")


def test_a_checkpoint_is_named_by_its_last_path_part_without_the_hub_folder_prefix():
    from pipeline.core.checkpoints import checkpoint_name

    assert checkpoint_name("hf://sentence-transformers/all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"
    assert checkpoint_name("/site-packages/data/sentence-transformers__all-MiniLM-L6-v2/") == "all-MiniLM-L6-v2"
    assert checkpoint_name("C:\\models\\my_bert") == "my_bert"
    assert checkpoint_name("bert_small_en_uncased") == "bert_small_en_uncased"
    assert checkpoint_name("kaggle://keras/bert/keras/bert_tiny_en_uncased/2") == "bert_tiny_en_uncased"  # no version


def refuse_network(*args, **kwargs):
    raise ConnectionRefusedError("network refused by the test")


def test_an_hf_handle_offline_is_the_installed_checkpoint_folder(minilm_checkpoint, monkeypatch, capsys):
    import socket

    monkeypatch.setattr(socket, "create_connection", refuse_network)
    handle = "hf://sentence-transformers/all-MiniLM-L6-v2"
    assert checkpoints.reachable_preset(handle) == str(minilm_checkpoint)
    assert f"{handle} from the installed folder {minilm_checkpoint}" in capsys.readouterr().out
    assert checkpoints.reachable_preset("hf://someone/not-installed") == "hf://someone/not-installed"
    assert checkpoints.reachable_preset("bert_tiny_en_uncased") == "bert_tiny_en_uncased"


def test_an_hf_handle_online_stays_the_handle(minilm_checkpoint, monkeypatch):
    monkeypatch.setattr(checkpoints, "host_reachable", lambda host, *args, **kwargs: True)
    handle = "hf://sentence-transformers/all-MiniLM-L6-v2"
    assert checkpoints.reachable_preset(handle) == handle
