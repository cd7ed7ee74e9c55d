"""The Transformer encoder classifier: pure model construction, no file or MLflow I/O.

Token ids (``[CLS]`` at position 0, ``[PAD]`` = 0 after the text) -> token embedding
plus positional information -> KerasHub ``TransformerEncoder`` blocks, each given the
padding mask explicitly -> pooling (``first_token`` or masked ``mean``) -> dropout ->
a ``num_classes``-way softmax in float32 for every class count, two included (see
``pipeline.predictions`` for why). The small custom layers are registered so a saved
``.keras`` file loads back wherever ``pipeline.model`` is importable.
"""

from __future__ import annotations

import keras
import keras_hub
from keras import ops

from pipeline.config import ModelConfig
from pipeline.errors import InputError
from pipeline.text import PAD_ID

PACKAGE = "pipeline"


@keras.saving.register_keras_serializable(package=PACKAGE)
class PaddingMask(keras.layers.Layer):
    """``True`` where a position holds a real token, ``False`` where it holds ``[PAD]``."""

    def __init__(self, pad_id: int = PAD_ID, **kwargs):
        super().__init__(**kwargs)
        self.pad_id = pad_id

    def call(self, token_ids):
        return ops.not_equal(token_ids, self.pad_id)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package=PACKAGE)
class FirstTokenPooling(keras.layers.Layer):
    """The vector at position 0: the ``[CLS]`` token, which attends to the whole review."""

    def call(self, sequence, padding_mask=None):
        return sequence[:, 0, :]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedMeanPooling(keras.layers.Layer):
    """Mean of the token vectors over non-padding positions only (``[CLS]`` included).

    Unlike ``GlobalAveragePooling1D`` without a mask, padding never dilutes the mean, so a
    review's vector does not depend on how much padding follows it.
    """

    def call(self, sequence, padding_mask=None):
        if padding_mask is None:
            return ops.mean(sequence, axis=1)
        weights = ops.cast(ops.expand_dims(padding_mask, -1), sequence.dtype)
        total = ops.sum(sequence * weights, axis=1)
        count = ops.maximum(ops.sum(weights, axis=1), ops.cast(1.0, sequence.dtype))
        return total / count

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])


POOLING_LAYERS = {"first_token": FirstTokenPooling, "mean": MaskedMeanPooling}


def encode_tokens(config: ModelConfig, vocabulary_size: int, max_sequence_length: int, token_ids):
    """The encoder backbone applied to ``token_ids`` (a Keras input): embedding, positions, blocks.

    Returns ``(sequence [batch, length, hidden_dim], padding_mask, token_embedding layer)``. The
    classifier and the masked-language model are both built with it, so their backbone layers
    have the same names (``BACKBONE_LAYERS``) and pretrained weights transfer by name.
    """
    padding_mask = PaddingMask(name="padding_mask")(token_ids)
    # KerasHub's ReversibleEmbedding: an Embedding whose matrix can also project back onto the
    # vocabulary, which is how the masked-LM head ties its output to it.
    embedding = keras_hub.layers.ReversibleEmbedding(vocabulary_size, config.hidden_dim, tie_weights=True,
                                                     name="token_embedding")
    x = embedding(token_ids)
    if config.position == "learned":
        positions = keras_hub.layers.PositionEmbedding(max_sequence_length, name="position_embedding")(x)
        x = keras.layers.Add(name="add_positions")([x, positions])
    elif config.position == "sinusoidal":
        positions = keras_hub.layers.SinePositionEncoding(name="position_encoding")(x)
        x = keras.layers.Add(name="add_positions")([x, positions])
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="embedding_norm")(x)
    x = keras.layers.Dropout(config.dropout, name="embedding_dropout")(x)
    for index in range(config.num_layers):
        x = keras_hub.layers.TransformerEncoder(
            intermediate_dim=config.intermediate_dim,
            num_heads=config.num_heads,
            dropout=config.dropout,
            activation="gelu",
            name=f"encoder_{index}",
        )(x, padding_mask=padding_mask)
    return x, padding_mask, embedding


def backbone_layer_names(model: keras.Model) -> list[str]:
    """Names of the model's backbone layers that hold weights (what pretraining hands to fine-tuning)."""
    fixed = {"token_embedding", "position_embedding", "embedding_norm"}
    return [layer.name for layer in model.layers
            if layer.weights and (layer.name in fixed or layer.name.startswith("encoder_"))]


def backbone_weights(model: keras.Model) -> dict[str, list]:
    """``{layer name: weight arrays}`` of the backbone layers, e.g. of a pretrained masked-LM model."""
    return {name: model.get_layer(name).get_weights() for name in backbone_layer_names(model)}


def load_backbone_weights(model: keras.Model, weights: dict[str, list], source: str) -> list[str]:
    """Copy pretrained backbone weights into ``model`` by layer name; returns the layers loaded.

    A layer missing on either side or a weight of another shape (another vocabulary size, width,
    depth or position range) is an error naming the layer, both shapes and ``source``.
    """
    wanted = backbone_layer_names(model)
    missing = sorted(set(wanted) - set(weights))
    if missing:
        raise InputError(f"{source}: pretrained weights have no layer(s) {missing}: the pretrained encoder has "
                         "fewer blocks or another position type than this model")
    for name in wanted:
        layer = model.get_layer(name)
        if len(layer.weights) != len(weights[name]):
            raise InputError(f"{source}: pretrained {name} has {len(weights[name])} weights, this model "
                             f"{len(layer.weights)}: a different encoder layout")
        for target, value in zip(layer.weights, weights[name]):
            if tuple(target.shape) != tuple(value.shape):
                raise InputError(f"{source}: pretrained {target.path} has shape {tuple(value.shape)}, this model "
                                 f"{tuple(target.shape)}: a different vocabulary size, width or sequence length")
        layer.set_weights(weights[name])
    return wanted


def build_model(config: ModelConfig, vocabulary_size: int, max_sequence_length: int,
                num_classes: int = 2) -> keras.Model:
    """The classifier for ``vocabulary_size`` tokens and inputs up to ``max_sequence_length`` long.

    The output is ``[batch, num_classes]`` class probabilities from a softmax, two classes
    included (one prediction shape for the whole package). The input length is left open (``None``) so a batch may be
    trimmed of trailing padding columns; learned positions cover up to ``max_sequence_length``.
    """
    if num_classes < 2:
        raise ValueError(f"a classifier needs at least 2 classes, got {num_classes}")
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x, padding_mask, _ = encode_tokens(config, vocabulary_size, max_sequence_length, token_ids)
    pooled = POOLING_LAYERS[config.pooling](name=f"{config.pooling}_pooling")(x, padding_mask=padding_mask)
    pooled = keras.layers.Dropout(config.classifier_dropout, name="classifier_dropout")(pooled)
    probabilities = keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                       name="class_probabilities")(pooled)
    return keras.Model(token_ids, probabilities, name=f"transformer_{config.pooling}")


def build_masked_lm(config: ModelConfig, vocabulary_size: int, max_sequence_length: int) -> keras.Model:
    """The same backbone under KerasHub's ``MaskedLMHead``, its output projection tied to the token embedding.

    Inputs ``{"token_ids": [batch, length], "mask_positions": [batch, masked]}``; output: logits
    over the vocabulary at the masked positions, ``[batch, masked, vocabulary_size]``, float32.
    """
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    mask_positions = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
    x, _, embedding = encode_tokens(config, vocabulary_size, max_sequence_length, token_ids)
    logits = keras_hub.layers.MaskedLMHead(token_embedding=embedding, intermediate_activation="gelu",
                                           name="mlm_head")(x, mask_positions=mask_positions)
    logits = keras.layers.Activation("linear", dtype="float32", name="mlm_logits")(logits)
    return keras.Model({"token_ids": token_ids, "mask_positions": mask_positions}, logits, name="masked_lm")


def encoder_blocks(model: keras.Model) -> list:
    return [layer for layer in model.layers if isinstance(layer, keras_hub.layers.TransformerEncoder)]


def last_block_attention(model: keras.Model, token_ids):
    """Attention weights ``[batch, heads, query, key]`` of the last encoder block.

    Uses the block's own scores (``return_attention_scores=True``), not a re-implementation.
    """
    last = encoder_blocks(model)[-1]
    # The block was called with padding_mask as a tensor argument, so its recorded input is
    # [hidden states, padding mask].
    hidden, mask = keras.Model(model.input, last.input)(token_ids)
    _, scores = last(hidden, padding_mask=mask, return_attention_scores=True)
    return ops.convert_to_numpy(scores)
