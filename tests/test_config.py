from pathlib import Path

import pytest

from pipeline.config import Config, load_config, parse_override
from tests.conftest import PROJECT_ROOT


@pytest.mark.parametrize("name", ["default.yaml", "smoke.yaml"])
def test_shipped_configs_load(name):
    config = load_config(PROJECT_ROOT / "configs" / name)
    assert isinstance(config, Config)


def test_overrides_are_typed_and_applied():
    config = load_config(None, ["model.pooling=mean", "training.epochs=7", "compare.seeds=[4, 5]",
                                "training.learning_rate=1"])
    assert config.model.pooling == "mean"
    assert config.training.epochs == 7
    assert config.compare.seeds == (4, 5)
    assert config.training.learning_rate == 1.0 and isinstance(config.training.learning_rate, float)


def test_config_is_frozen():
    config = load_config()
    with pytest.raises(AttributeError):
        config.model.pooling = "mean"  # type: ignore[misc]


def test_unknown_key_names_key_and_file(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  poolling: mean\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*model\.poolling"):
        load_config(path)


def test_unknown_section_is_an_error(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("modle:\n  pooling: mean\n")
    with pytest.raises(ValueError, match="unknown section 'modle'"):
        load_config(path)


def test_wrong_type_names_key_and_file(tmp_path: Path):
    path = tmp_path / "bad.yaml"
    path.write_text("training:\n  epochs: three\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*training\.epochs must be an integer"):
        load_config(path)


def test_invalid_value_is_explained():
    with pytest.raises(ValueError, match="model.pooling must be one of"):
        load_config(None, ["model.pooling=max"])


def test_bad_override_syntax():
    with pytest.raises(ValueError, match="section.key=value"):
        parse_override("pooling=mean")


def test_section_hash_tracks_only_named_sections():
    base = load_config()
    changed_model = base.replace(model={"pooling": "mean"})
    assert base.section_hash("data") == changed_model.section_hash("data")
    assert base.section_hash("model") != changed_model.section_hash("model")
