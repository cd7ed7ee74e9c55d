"""A pretrained KerasHub encoder network (``model.preset``) as the pipeline's model: the preset's backbone, checked,
and the classifier put on it. Pure construction; the stages do the file and MLflow I/O. The preset's tokenizer:
``pipeline.text.preset_tokenizer``; where a preset lives: ``pipeline.core.checkpoints``.

The train stage puts the pipeline's pooling and classifier head on the preset's backbone. The saved ``.keras`` model
holds the fine-tuned backbone and the run's tokenizer folder holds the tokenizer, so a trained model never needs the
preset again.
"""

from __future__ import annotations

from pipeline.config import ModelConfig
from pipeline.core.checkpoints import check_preset_location, hub_access, load_failed, reachable_preset
from pipeline.core.errors import ConfigError, InputError


def load_preset_backbone(preset: str, load_weights: bool = True, dtype: str | None = None):
    """The preset's backbone (its pretrained weights when ``load_weights``); one that is not a text encoder (no
    ``token_ids`` and ``padding_mask`` inputs) is an error."""
    import keras_hub

    preset = reachable_preset(preset)  # offline: the installed folder of an hf:// checkpoint, when there is one
    check_preset_location(preset)
    with hub_access(preset) as reachable:
        try:
            backbone = keras_hub.models.Backbone.from_preset(preset, load_weights=load_weights, dtype=dtype)
        except Exception as error:
            raise load_failed(preset, "backbone", error, reachable) from None
    check_text_backbone(backbone, preset)
    return backbone


def check_text_backbone(backbone, preset: str) -> None:
    inputs = backbone.input if isinstance(backbone.input, dict) else {}
    if not {"token_ids", "padding_mask"} <= set(inputs):
        raise InputError(
            f"model.preset: {preset!r} holds a {type(backbone).__name__}, not a text encoder (it takes "
            f"{sorted(inputs) or 'one tensor'}, not token_ids and padding_mask)"
        )


# --------------------------------------------------------------------------- the classifier on the preset's backbone


def build_preset_model(model_config: ModelConfig, backbone, num_classes: int = 2):
    """The classifier: token ids -> padding mask -> the preset's backbone -> the pipeline's pooling (the start
    token's vector, or the masked mean over the preset's padding mask) -> dropout -> softmax in float32."""
    import keras

    from pipeline.model.transformer import POOLING_LAYERS, PaddingMask, SegmentIds

    if num_classes < 2:
        raise InputError(f"a classifier needs at least 2 classes, got {num_classes}")
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = PaddingMask(name="padding_mask")(token_ids)
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    if "segment_ids" in backbone.input:
        inputs["segment_ids"] = SegmentIds(name="segment_ids")(token_ids)
    outputs = backbone(inputs)
    sequence = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
    for layer in backbone.layers:  # BERT's pooler feeds only its pooled_output, which the pipeline's pooling replaces
        if layer.name == "pooled_dense":
            layer.trainable = False
    pooling = model_config.pooling
    pooled = POOLING_LAYERS[pooling](name=f"{pooling}_pooling")(sequence, padding_mask=padding_mask)
    pooled = keras.layers.Dropout(model_config.classifier_dropout, name="classifier_dropout")(pooled)
    probabilities = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="class_probabilities")(
        pooled
    )
    return keras.Model(token_ids, probabilities, name=f"preset_{pooling}")


def preset_backbone_of(model):
    """The KerasHub backbone inside a classifier built by :func:`build_preset_model` (None for the pipeline's own
    encoder)."""
    import keras_hub

    return next((layer for layer in model.layers if isinstance(layer, keras_hub.models.Backbone)), None)


def preset_classifier(
    model_config: ModelConfig, text_tokenizer, num_classes: int, on_cpu: bool, dtype: str | None = None
):
    """The classifier on ``model.preset``'s pretrained backbone, for the ids ``text_tokenizer`` made.

    Refused: ids from another tokenizer than the preset's, and on a CPU a backbone larger than
    ``model.preset_max_parameters_on_cpu`` (hours per epoch there; a GPU, a smaller preset or a higher limit).
    """
    preset = model_config.preset
    made_by = text_tokenizer.preset
    if made_by != preset:
        raise InputError(
            f"the tokenized data was made with {'preset ' + repr(made_by) if made_by else 'the pipeline'}"
            f"'s tokenizer, not model.preset {preset!r}'s: rerun `make tokenize` with this config"
        )
    if preset is None:
        raise ConfigError("a preset classifier needs model.preset (the pipeline's own encoder is built without one)")
    backbone = load_preset_backbone(preset, load_weights=True, dtype=dtype)
    parameters = backbone.count_params()
    limit = model_config.preset_max_parameters_on_cpu
    if on_cpu and parameters > limit:
        raise ConfigError(
            f"model.preset {preset!r} has {parameters:,} parameters, more than "
            f"model.preset_max_parameters_on_cpu ({limit:,}): fine-tuning it without a GPU takes hours "
            "per epoch. Use a machine with a GPU, a smaller preset, or raise that setting"
        )
    return build_preset_model(model_config, backbone, num_classes)
