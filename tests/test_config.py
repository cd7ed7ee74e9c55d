from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config, parse_override
from pipeline.core.errors import ConfigError
from pipeline.stages.compare.designs import design_for
from tests.conftest import PROJECT_ROOT

SEARCH_SPACE = "tune.yaml"  # `make tune`'s search space, not a config (tests/experiments/test_tune.py reads it)
SHIPPED = sorted(path.name for path in (PROJECT_ROOT / "configs").glob("*.yaml") if path.name != SEARCH_SPACE)


def build_from(path: Path, num_classes: int = 3, vocabulary_size: int = 300):
    """What a config file must be good for: it loads (every section validated), a batch its training section
    would make from full-length ids is ``max_sequence_length`` wide, and its model section builds a classifier
    that maps that batch to ``[rows, num_classes]`` probabilities.

    A small vocabulary (the shapes that matter are the encoder's), two rows and no compiled step keep gpu.yaml
    cheap on a CPU (test_gpu_config_loads_and_each_model_takes_a_step_on_cpu trains it).
    """
    import numpy as np

    from pipeline.model.transformer import build_model
    from pipeline.runtime.datasets import make_dataset

    config = load_config(path)
    rows, length = 2, config.tokenizer.max_sequence_length
    ids = np.random.default_rng(0).integers(5, vocabulary_size, (rows, length)).astype("int32")
    batch_ids, batch_labels = next(iter(make_dataset(ids, np.arange(rows) % num_classes, batch_size=rows)))
    assert batch_ids.shape == (rows, length) and batch_labels.shape == (rows,)
    if config.model.preset is not None:  # a preset name or hub handle (no download here): its head on a tiny stand-in
        import tempfile

        import keras_hub

        from pipeline.core.checkpoints import is_handle
        from pipeline.model.preset_classifier import build_preset_model, load_preset_backbone
        from tests.tiny_preset import write_tiny_preset

        assert config.model.preset in keras_hub.models.Backbone.presets or is_handle(config.model.preset)
        with tempfile.TemporaryDirectory() as folder:
            stand_in = write_tiny_preset(Path(folder) / "preset", max_sequence_length=length)
            backbone = load_preset_backbone(str(stand_in))
        classifier = build_preset_model(config.model, backbone, num_classes)
        batch_ids = np.minimum(batch_ids, backbone.vocabulary_size - 1)
    else:
        classifier = build_model(config.model, vocabulary_size, length, num_classes)
    probabilities = np.asarray(classifier(batch_ids, training=False))
    assert probabilities.shape == (rows, num_classes)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    return config


def test_shipped_configs_are_the_yaml_files_beside_the_search_space():
    """SHIPPED, which the tests below parametrize over, holds every config in configs/ (none skipped)."""
    assert (PROJECT_ROOT / "configs" / SEARCH_SPACE).is_file()
    assert SHIPPED == sorted(
        p.name for p in (PROJECT_ROOT / "configs").iterdir() if p.suffix in (".yaml", ".yml") and p.name != SEARCH_SPACE
    )
    assert {"default.yaml", "smoke.yaml"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_config_builds_a_classifier_of_its_shape(name):
    build_from(PROJECT_ROOT / "configs" / name)


@pytest.mark.parametrize(
    "typo, message",
    [
        ("hidden_dim: 16", "hidden_dimm"),
        ("max_sequence_length: 32", "max_sequence_lenght"),
    ],
)
def test_the_shipped_config_check_fails_on_a_broken_copy(tmp_path, typo, message):
    """The control: the check above fails on smoke.yaml with one key misspelt."""
    text = (PROJECT_ROOT / "configs" / "smoke.yaml").read_text()
    assert typo in text
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace(typo, typo.replace(typo.split(":")[0], message)))
    with pytest.raises(ConfigError, match=message):
        build_from(broken)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load_with_every_value_they_set(name):
    """Each value a shipped YAML sets is the loaded config's value (none dropped, renamed or retyped away)."""
    path = PROJECT_ROOT / "configs" / name
    config = load_config(path).to_dict()
    for section, values in (yaml.safe_load(path.read_text()) or {}).items():
        for key, value in values.items():
            loaded = config[section][key]
            expected = list(value) if isinstance(value, (list, tuple)) else value
            if isinstance(value, str):  # {config}: the file's name
                expected = value.replace("{config}", path.stem)
            assert (list(loaded) if isinstance(loaded, (list, tuple)) else loaded) == expected, (
                f"{name}: {section}.{key}"
            )


def test_a_config_with_an_unknown_key_is_refused_naming_it(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model:\n  hidden_dimm: 64\n")
    with pytest.raises(ConfigError, match="hidden_dimm"):
        load_config(path)


def test_overrides_are_typed_and_applied():
    config = load_config(
        None, ["model.pooling=mean", "training.epochs=7", "compare.seeds=[4, 5]", "training.learning_rate=1"]
    )
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


def test_gpu_config_loads_and_each_model_takes_a_step_on_cpu():
    """configs/gpu.yaml is sized for a GPU; here it must at least load and train one step of each model."""
    import keras
    import numpy as np

    from pipeline.model.adversarial import AdversarialClassifier
    from pipeline.model.transformer import build_masked_lm, build_model

    config = load_config(PROJECT_ROOT / "configs" / "gpu.yaml")
    assert config.model.init == "pretrained" and config.tokenizer.max_sequence_length == 512
    assert config.training.pseudo_labels and config.pseudo_label.max_rows is None  # every unlabeled review
    assert config.model.long_reviews == "windows" and config.training.adversarial_epsilon == 2.0
    # a small vocabulary and 64-token rows: the shapes that matter are the encoder's width, depth and heads, and its
    # 512 learned positions (built whatever the rows' length, which the model leaves open)
    vocabulary, length = 300, config.tokenizer.max_sequence_length
    ids = np.random.default_rng(0).integers(5, vocabulary, (2, 64)).astype("int32")
    config = config.replace(model={"ngram_buckets": 1024})  # its n-gram table's rows only cost memory, not shape
    classifier = build_model(config.model, vocabulary, length)
    assert classifier.get_layer("position_embedding").position_embeddings.shape[0] == length
    # eager: one step each needs no traced graph (6 s instead of 26 s here, same arithmetic)
    classifier.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
    assert np.isfinite(classifier.train_on_batch(ids, np.array([0, 1])))
    adversarial = AdversarialClassifier(classifier, config.training.adversarial_epsilon)  # as training wraps it
    adversarial.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
    assert np.isfinite(adversarial.train_on_batch(ids, np.array([0, 1])))
    masked_lm = build_masked_lm(config.model, vocabulary, length)
    masked_lm.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True
    )
    positions = np.array([[1, 2, 3], [4, 5, 6]], dtype="int32")
    assert np.isfinite(masked_lm.train_on_batch({"token_ids": ids, "mask_positions": positions}, ids[:, 1:4]))


def test_the_comparison_design_comes_from_the_compare_section():
    design = design_for(load_config(None, ["compare.inits=[pretrained, scratch]"]))
    assert [key for key, _ in design.factors] == ["model.pooling", "model.init"]
    assert design.fixed == () and design.champion_pool  # the other settings: as the model section says
    fixed = design_for(load_config(None, ["compare.sparse_updates=[false]"]))
    assert fixed.fixed == (("training.sparse_updates", False),)
    lever = design_for(load_config(None, ["compare.poolings=[first_token]", "compare.sparse_updates=[false, true]"]))
    assert lever.factors == (("training.sparse_updates", (False, True)),)
    assert ("model.pooling", "first_token") in lever.fixed
    assert design_for(load_config(), "position").report_name == "ablation_position"


def test_long_reviews_are_a_factor_and_windows_are_refused_with_a_preset():
    from pipeline.stages.compare.designs import variant_config, variant_name, variants

    config = load_config(None, ["compare.poolings=[first_token]", "compare.long_reviews=[truncate, windows]"])
    design = design_for(config)
    assert design.factors == (("model.long_reviews", ("truncate", "windows")),)
    assert [variant_name(v) for v in variants(design)] == ["truncate", "windows"]
    assert [variant_config(config, design, v, 2).model.long_reviews for v in variants(design)] == [
        "truncate",
        "windows",
    ]
    with pytest.raises(ConfigError, match="model.long_reviews must be one of"):
        load_config(None, ["model.long_reviews=whole"])
    with pytest.raises(ConfigError, match="set model.long_reviews=truncate"):
        load_config(PROJECT_ROOT / "configs" / "preset.yaml", ["model.long_reviews=windows"])
    assert load_config(PROJECT_ROOT / "configs" / "preset.yaml").model.long_reviews == "truncate"


def test_ngrams_are_a_factor_named_by_their_setting():
    from pipeline.stages.compare.designs import variant_config, variant_name, variants

    config = load_config(None, ["compare.poolings=[first_token]", "compare.ngrams=[1, 3]"])
    design = design_for(config)
    assert design.factors == (("model.ngram_max", (1, 3)),)
    assert [variant_name(v) for v in variants(design)] == ["ngram_max=1", "ngram_max=3"]
    assert [variant_config(config, design, v, 2).model.ngram_max for v in variants(design)] == [1, 3]
    # a tokens-only backbone keeps the hash it had before n-grams existed; one with n-grams gets its own
    assert "ngram_max" not in load_config(None, ["model.ngram_max=1"]).model.backbone()
    assert load_config(None, ["model.ngram_max=2"]).model.backbone()["ngram_buckets"] == 262_144


@pytest.mark.parametrize(
    "override, message",
    [
        ("compare.poolings=[first_token, mean, max]", "max"),
        ("compare.inits=[scratch, scratch]", "one or two different levels"),
        ("compare.long_reviews=[whole]", "whole"),
        ("compare.fusion_weights=1", "fusion_weights"),
        ("compare.cascade_share=0", "cascade_share"),
        ("compare.cascade_share=1.5", "cascade_share"),
        ("compare.ngrams=[1, 9]", "9"),
        ("model.ngram_max=0", "model.ngram_max"),
        ("model.ngram_buckets=1", "model.ngram_buckets"),
        ("model.ngram_dropout=1.0", "model.ngram_dropout"),
    ],
)
def test_a_bad_comparison_is_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_at_most_two_factors_vary_at_once():
    with pytest.raises(ConfigError, match="at most two factors"):
        load_config(None, ["compare.inits=[pretrained, scratch]", "compare.sparse_updates=[false, true]"])


def test_pseudo_label_max_rows_counts_in_the_hash_only_when_set():
    """Pseudo labels and the comparisons that train on them, made before ``max_rows`` existed, keep their hash."""
    import dataclasses
    import hashlib
    import json

    config = load_config(PROJECT_ROOT / "configs" / "default.yaml", ["pseudo_label.max_rows=null"])
    payload = {"pseudo_label": dataclasses.asdict(config.pseudo_label)}
    payload["pseudo_label"].pop("max_rows")
    earlier = hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:16]
    assert config.section_hash("pseudo_label") == earlier
    default = load_config(PROJECT_ROOT / "configs" / "default.yaml")  # the control: 10,000 rows, another hash
    assert default.pseudo_label.max_rows == 10_000 and default.section_hash("pseudo_label") != earlier


def test_keys_added_for_ngrams_presets_and_sparse_updates_leave_the_hashes_of_runs_without_them_as_they_were():
    """A run recorded before n-grams and presets existed keeps its folder (model + training hash) and its comparison
    (compare hash): the hash is the one the earlier code computed, json of the section without the new keys (and
    with the keys retired since, at the value every such run had)."""
    import dataclasses
    import hashlib
    import json

    from pipeline.config import NGRAM_KEYS, PRESET_KEYS

    def earlier_hash(config, *sections):
        payload = {name: dataclasses.asdict(getattr(config, name)) for name in sections}
        if "model" in payload:
            payload["model"]["token_embedding"] = "random"
        if "compare" in payload:
            payload["compare"]["token_embeddings"] = None
        for key in NGRAM_KEYS + PRESET_KEYS:
            payload.get("model", {}).pop(key, None)
        payload.get("compare", {}).pop("ngrams", None)
        for section, key in (
            ("compare", "sparse_updates"),
            ("compare", "adversarial_epsilons"),
            ("training", "sparse_updates"),
            ("training", "adversarial_epsilon"),
            ("model", "long_reviews"),
            ("compare", "long_reviews"),
            ("compare", "cascade_share"),
        ):
            payload.get(section, {}).pop(key, None)
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:16]

    for name in SHIPPED:
        config = load_config(
            PROJECT_ROOT / "configs" / name,
            [
                "model.ngram_max=1",
                "model.preset=null",
                "training.sparse_updates=false",
                "model.long_reviews=truncate",
                "training.adversarial_epsilon=0",
                "compare.cascade_share=1",
            ],
        )
        for sections in (("model", "training"), ("compare", "model", "training")):
            assert config.section_hash(*sections) == earlier_hash(config, *sections), (name, sections)
    # the controls: with a preset, or with n-grams on (or compared), the hash is another one
    config = load_config(PROJECT_ROOT / "configs" / "preset.yaml")
    assert config.section_hash("model", "training") != earlier_hash(config, "model", "training")
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", ["model.ngram_max=3"])
    assert config.section_hash("model", "training") != earlier_hash(config, "model", "training")
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", ["model.ngram_max=1", "training.sparse_updates=true"])
    assert config.section_hash("model", "training") != earlier_hash(config, "model", "training")
    config = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml", ["model.ngram_max=1", "compare.sparse_updates=[false, true]"]
    )
    assert config.section_hash("compare") != earlier_hash(config, "compare")
    config = load_config(PROJECT_ROOT / "configs" / "short_texts.yaml", ["model.preset=null", "model.ngram_max=1"])
    assert config.section_hash("compare") != earlier_hash(config, "compare")  # its cascade is a comparison of its own
    config = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        ["model.ngram_max=1", "training.sparse_updates=false", "training.adversarial_epsilon=1.0"],
    )
    assert config.section_hash("model", "training") != earlier_hash(config, "model", "training")
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", ["compare.ngrams=[1, 3]", "model.ngram_max=1"])
    assert config.section_hash("compare") != earlier_hash(config, "compare")
    # a comparison of n-grams is another comparison for each n-gram setting its variants inherit
    other = config.with_settings([("model.ngram_dropout", config.model.ngram_dropout / 2 + 0.1)])
    assert other.section_hash("compare", "model") != config.section_hash("compare", "model")
    assert other.section_hash("model") == config.section_hash("model")  # its tokens-only runs are shared
    windows = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        ["model.ngram_max=1", "training.sparse_updates=false", "model.long_reviews=windows"],
    )
    assert windows.section_hash("model", "training") != earlier_hash(windows, "model", "training")


def test_the_nbsvm_section_reads_its_old_names_and_hashes_as_it_did(tmp_path):
    """``baseline`` (and its ``nbsvm_c``) was renamed ``nbsvm`` (``c_values``): old files and ``--set`` still load,
    and the hash is the one computed under the old names, so NBSVM runs recorded before the rename are reused."""
    import dataclasses
    import hashlib
    import json

    old = tmp_path / "old.yaml"
    old.write_text("baseline:\n  nbsvm_c: [0.5, 2.0]\n  crops_per_review: 1\n")
    config = load_config(old, ["baseline.seed=7"])
    assert config.nbsvm.c_values == (0.5, 2.0) and config.nbsvm.crops_per_review == 1 and config.nbsvm.seed == 7
    assert config == load_config(None, ["nbsvm.c_values=[0.5, 2.0]", "nbsvm.crops_per_review=1", "nbsvm.seed=7"])
    values = dataclasses.asdict(config.nbsvm)
    values["nbsvm_c"] = values.pop("c_values")
    earlier = hashlib.sha256(json.dumps({"baseline": values}, sort_keys=True, default=list).encode()).hexdigest()
    assert config.section_hash("nbsvm") == earlier[:16]
    both = tmp_path / "both.yaml"
    both.write_text("baseline:\n  seed: 1\nnbsvm:\n  seed: 2\n")
    with pytest.raises(ConfigError, match="both 'nbsvm' and its old name 'baseline'"):
        load_config(both)
    both.write_text("nbsvm:\n  nbsvm_c: [1.0]\n  c_values: [2.0]\n")
    with pytest.raises(ConfigError, match="old and its new name"):
        load_config(both)


# The settings measured, found not to pay and removed: a config naming one (a YAML file's sections), the key and where
# the measurement is written up
RETIRED = [
    ({"model": {"preset": "somewhere", "ngram_max": 1, "preset_blocks": 4}}, "model.preset_blocks", "fewer-blocks"),
    ({"model": {"token_embedding": "word2vec"}}, "model.token_embedding", "docs/results.md"),
    ({"compare": {"token_embeddings": ["random", "word2vec"]}}, "compare.token_embeddings", "docs/results.md"),
]


@pytest.mark.parametrize("sections, key, write_up", RETIRED, ids=[key for _, key, _ in RETIRED])
def test_a_config_file_setting_a_retired_key_is_refused_in_one_line_naming_it(tmp_path, sections, key, write_up):
    import re

    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(sections))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    where = re.escape(str(path))
    pattern = rf"{where}: {re.escape(key)} was retired \([^\n]*{re.escape(write_up)}[^\n]*\); remove it from {where}"
    assert re.fullmatch(pattern, str(error.value)), str(error.value)


@pytest.mark.parametrize(
    "override", ["model.token_embedding=word2vec", "model.preset_blocks=2", "compare.token_embeddings=[word2vec]"]
)
def test_a_set_naming_a_retired_key_is_one_error_line_naming_it(override, capsys):
    import re

    from pipeline.__main__ import main

    assert main(["train", "--set", override]) == 2
    said = capsys.readouterr().err
    key = override.split("=")[0]
    pattern = rf"error: --set {re.escape(override)}: {re.escape(key)} was retired \([^\n]+\); leave that --set out\n"
    assert re.fullmatch(pattern, said), said


def test_a_config_written_before_the_retirement_still_loads_as_todays(tmp_path):
    """A tune's ``best.yaml`` or an old copy of a shipped config holds every key, the retired ones at the value every
    run had (which means what today's code does): it loads as today's config, and so does ``--set`` at that value.
    The retired keys are no run's parameters any more (``tracking.flat_params`` logs the resolved config)."""
    import json

    from pipeline.tracking import flat_params

    today = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")
    raw = json.loads(json.dumps(today.to_dict()))
    raw["model"].update(token_embedding="random", preset_blocks=None)
    raw["compare"]["token_embeddings"] = None
    old = tmp_path / "best.yaml"
    old.write_text(yaml.safe_dump(raw))
    assert load_config(old) == today
    at_old_values = ["model.token_embedding=random", "model.preset_blocks=null", "compare.token_embeddings=[random]"]
    assert load_config(PROJECT_ROOT / "configs" / "smoke.yaml", at_old_values) == today
    assert not {"model.token_embedding", "model.preset_blocks", "compare.token_embeddings"} & set(flat_params(today))
    raw["model"]["preset_blocks"] = 2  # the control: the same file with the retired setting on is refused
    old.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="model.preset_blocks was retired"):
        load_config(old)
