"""The Transformer encoder classifier: pure model construction, no file or MLflow I/O.

Token ids (``[CLS]`` at position 0, ``[PAD]`` = 0 after the text) -> token embedding (plus, with
``model.ngram_max`` > 1, the hashed n-grams ending at each position) plus positional information -> KerasHub
``TransformerEncoder`` blocks, each given the padding mask explicitly -> pooling (``first_token`` or masked ``mean``) ->
dropout -> a ``num_classes``-way softmax in float32 for every class count, two included (see
``pipeline.core.predictions`` for why). The small custom layers are registered so a saved
``.keras`` file loads back wherever ``pipeline.model.transformer`` is importable.
"""

from __future__ import annotations

import keras
import keras_hub
from keras import ops

from pipeline.config import ModelConfig
from pipeline.core.errors import InputError
from pipeline.text.conventions import PAD_ID

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
class SegmentIds(keras.layers.Layer):
    """All-zero segment ids (one segment: the review) for a pretrained backbone that takes them (BERT's)."""

    def call(self, token_ids):
        return ops.zeros_like(token_ids)

    def compute_output_shape(self, input_shape):
        return input_shape


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


POOLING_LAYERS: dict[str, type[keras.layers.Layer]] = {"first_token": FirstTokenPooling, "mean": MaskedMeanPooling}

# Odd multipliers of the polynomial hash, one per n (index n - 2): each n hashes into the shared table differently.
NGRAM_HASH_MULTIPLIERS = (1_000_003, 998_244_353, 1_000_000_007, 754_974_721, 167_772_161, 469_762_049, 1_004_535_809)


MAX_NGRAM_BUCKETS = 2**28  # the int32-safe hash below needs 4 * buckets <= 2^31 with one bit of headroom


def multiply_mod(values, multiplier: int, buckets: int):
    """``(values * multiplier) % buckets`` for int32 ``values`` in ``[0, buckets)``, in int32 without overflow on any
    backend (Keras runs int64 as int32 under JAX and torch): the multiplier's base-``2^c`` digits, most significant
    first, by Horner's rule, reduced after every step; ``c`` keeps each step's sum below ``2^31``."""
    multiplier %= buckets
    shift = 30 - buckets.bit_length()
    digit_mask = (1 << shift) - 1
    digits = []
    while True:
        digits.append(multiplier & digit_mask)
        multiplier >>= shift
        if not multiplier:
            break
    result = None
    for digit in reversed(digits):  # result < buckets and values * digit < buckets * 2^shift: the sum < 2^31
        term = values * digit
        result = term if result is None else result * (1 << shift) + term
        result = ops.mod(result, buckets)
    return result


def hashed_ngram_ids(token_ids, ngram_max: int, buckets: int):
    """``[batch, ngram_max - 1, length]`` bucket ids: entry ``n - 2`` at position ``i`` is the hash of the n-gram
    of token ids ending at ``i`` (``i - n + 1 .. i``; before the start counts as ``[PAD]``).

    A polynomial hash per n, ``h_n = (h_{n-1} * M_n + t_{i-n+1} + n) mod buckets`` with ``h_1 = t_i``, the n folded
    in so a bigram and a trigram of the same ids rarely share a bucket. Computed in int32 and reduced after every
    product (:func:`multiply_mod`), so it is the same integer on every backend and for every bucket count: a model
    trained under one Keras backend reads the same n-grams under another. Pure: nothing but the token ids travels
    with a model.
    """
    if not 2 <= buckets <= MAX_NGRAM_BUCKETS:
        raise ValueError(f"the n-gram hash takes 2 to {MAX_NGRAM_BUCKETS:,} buckets, got {buckets:,}")
    ids = ops.cast(token_ids, "int32")
    length = ops.shape(ids)[1]
    padded = ops.pad(ids, [[0, 0], [ngram_max - 1, 0]], constant_values=PAD_ID)
    hashes, ngrams = ops.mod(ids, buckets), []  # the 1-gram ending at i: the token itself (t_i mod buckets)
    for back in range(1, ngram_max):  # back = 1: the token before i, 2: the one before that, ...
        shifted = padded[:, ngram_max - 1 - back : ngram_max - 1 - back + length]
        n = back + 1
        multiplier = NGRAM_HASH_MULTIPLIERS[(n - 2) % len(NGRAM_HASH_MULTIPLIERS)]
        hashes = ops.mod(multiply_mod(hashes, multiplier, buckets) + ops.mod(shifted, buckets) + n, buckets)
        ngrams.append(hashes)
    return ops.stack(ngrams, axis=1)


@keras.saving.register_keras_serializable(package=PACKAGE)
class HashedNgramEmbedding(keras.layers.Layer):
    """The summed vectors of the hashed 2- to ``ngram_max``-grams of token ids ending at each position.

    One table of ``buckets`` rows shared by every n (fastText's hashing trick; N-Grammer, Roy et al. 2022,
    adds n-gram vectors to the token vectors the same way). Added to the token embedding, it gives every
    position the local phrase it ends ("not good", "waste of time") before attention sees it. Positions
    holding ``[PAD]`` get a zero vector, so padding changes nothing. ``dropout`` drops whole n-gram vectors
    (each n-gram of a position independently) during training: the table has far more rows than the
    training set has n-grams twice, and without it the model memorises them.
    """

    def __init__(
        self,
        ngram_max: int,
        buckets: int,
        output_dim: int,
        dropout: float = 0.0,
        pad_id: int = PAD_ID,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if ngram_max < 2:
            raise ValueError(f"HashedNgramEmbedding needs ngram_max >= 2, got {ngram_max}")
        if not 2 <= buckets <= MAX_NGRAM_BUCKETS:
            raise ValueError(f"HashedNgramEmbedding needs 2 to {MAX_NGRAM_BUCKETS:,} buckets, got {buckets:,}")
        self.ngram_max, self.buckets, self.output_dim = ngram_max, buckets, output_dim
        self.dropout, self.pad_id = dropout, pad_id
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape):
        self.table = keras.layers.Embedding(
            self.buckets, self.output_dim, embeddings_initializer=self.embeddings_initializer, name="table"
        )
        self.table.build((None, None))
        # one draw per (row, n, position): a whole n-gram vector is kept or dropped
        self.vector_dropout = keras.layers.Dropout(
            self.dropout, noise_shape=(None, None, None, 1), name="vector_dropout"
        )
        self.built = True

    def call(self, token_ids, training=None):
        vectors = self.table(hashed_ngram_ids(token_ids, self.ngram_max, self.buckets))  # [batch, n-1, length, dim]
        summed = ops.sum(self.vector_dropout(vectors, training=training), axis=1)
        real = ops.cast(ops.expand_dims(ops.not_equal(token_ids, self.pad_id), -1), summed.dtype)
        return summed * real

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "ngram_max": self.ngram_max,
            "buckets": self.buckets,
            "output_dim": self.output_dim,
            "dropout": self.dropout,
            "pad_id": self.pad_id,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        }


def encode_tokens(config: ModelConfig, vocabulary_size: int, max_sequence_length: int, token_ids):
    """The encoder backbone applied to ``token_ids`` (a Keras input): embedding, positions, blocks.

    Returns ``(sequence [batch, length, hidden_dim], padding_mask, token_embedding layer)``. The
    classifier and the masked-language model are both built with it, so their backbone layers
    have the same names (``BACKBONE_LAYERS``) and pretrained weights transfer by name.
    """
    padding_mask = PaddingMask(name="padding_mask")(token_ids)
    # KerasHub's ReversibleEmbedding: an Embedding whose matrix can also project back onto the
    # vocabulary, which is how the masked-LM head ties its output to it.
    embedding = keras_hub.layers.ReversibleEmbedding(
        vocabulary_size, config.hidden_dim, tie_weights=True, name="token_embedding"
    )
    x = embedding(token_ids)
    if config.ngram_max > 1:
        ngrams = HashedNgramEmbedding(
            config.ngram_max,
            config.ngram_buckets,
            config.hidden_dim,
            dropout=config.ngram_dropout,
            name="ngram_embedding",
        )(token_ids)
        x = keras.layers.Add(name="add_ngrams")([x, ngrams])
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
    fixed = {"token_embedding", "ngram_embedding", "position_embedding", "embedding_norm"}
    return [
        layer.name
        for layer in model.layers
        if layer.weights and (layer.name in fixed or layer.name.startswith("encoder_"))
    ]


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
        raise InputError(
            f"{source}: pretrained weights have no layer(s) {missing}: the pretrained encoder has "
            "fewer blocks or another position type than this model"
        )
    for name in wanted:
        layer = model.get_layer(name)
        if len(layer.weights) != len(weights[name]):
            raise InputError(
                f"{source}: pretrained {name} has {len(weights[name])} weights, this model "
                f"{len(layer.weights)}: a different encoder layout"
            )
        for target, value in zip(layer.weights, weights[name]):
            if tuple(target.shape) != tuple(value.shape):
                raise InputError(
                    f"{source}: pretrained {target.path} has shape {tuple(value.shape)}, this model "
                    f"{tuple(target.shape)}: a different vocabulary size, width or sequence length"
                )
        layer.set_weights(weights[name])
    return wanted


def build_model(
    config: ModelConfig, vocabulary_size: int, max_sequence_length: int, num_classes: int = 2
) -> keras.Model:
    """The classifier for ``vocabulary_size`` tokens and inputs up to ``max_sequence_length`` long.

    The output is ``[batch, num_classes]`` class probabilities from a softmax, two classes
    included (one prediction shape for the whole package). The input length is left open (``None``) so a batch may be
    trimmed of trailing padding columns; learned positions cover up to ``max_sequence_length``.
    """
    if num_classes < 2:
        raise InputError(f"a classifier needs at least 2 classes, got {num_classes}")
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x, padding_mask, _ = encode_tokens(config, vocabulary_size, max_sequence_length, token_ids)
    pooled = POOLING_LAYERS[config.pooling](name=f"{config.pooling}_pooling")(x, padding_mask=padding_mask)
    pooled = keras.layers.Dropout(config.classifier_dropout, name="classifier_dropout")(pooled)
    probabilities = keras.layers.Dense(num_classes, activation="softmax", dtype="float32", name="class_probabilities")(
        pooled
    )
    return keras.Model(token_ids, probabilities, name=f"transformer_{config.pooling}")


def build_masked_lm(config: ModelConfig, vocabulary_size: int, max_sequence_length: int) -> keras.Model:
    """The same backbone under KerasHub's ``MaskedLMHead``, its output projection tied to the token embedding.

    Inputs ``{"token_ids": [batch, length], "mask_positions": [batch, masked]}``; output: logits
    over the vocabulary at the masked positions, ``[batch, masked, vocabulary_size]``, float32.
    """
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    mask_positions = keras.Input(shape=(None,), dtype="int32", name="mask_positions")
    x, _, embedding = encode_tokens(config, vocabulary_size, max_sequence_length, token_ids)
    logits = keras_hub.layers.MaskedLMHead(token_embedding=embedding, intermediate_activation="gelu", name="mlm_head")(
        x, mask_positions=mask_positions
    )
    logits = keras.layers.Activation("linear", dtype="float32", name="mlm_logits")(logits)
    return keras.Model({"token_ids": token_ids, "mask_positions": mask_positions}, logits, name="masked_lm")


def encoder_blocks(model: keras.Model) -> list:
    return [layer for layer in model.layers if isinstance(layer, keras_hub.layers.TransformerEncoder)]


def last_block_attention(model: keras.Model, token_ids):
    """Attention weights ``[batch, heads, query, key]`` of the last encoder block.

    Uses the block's own scores (``return_attention_scores=True``), not a re-implementation.
    """
    backbone = next((layer for layer in model.layers if isinstance(layer, keras_hub.models.Backbone)), None)
    if backbone is None:
        last = encoder_blocks(model)[-1]
        # The block was called with padding_mask as a tensor argument, so its recorded input is
        # [hidden states, padding mask].
        hidden, mask = keras.Model(model.input, last.input)(token_ids)
    else:
        # a preset's backbone (pipeline.model.preset_classifier): its own last block, given what the classifier gives it
        last = encoder_blocks(backbone)[-1]
        ids = ops.convert_to_numpy(token_ids)
        inputs = {"token_ids": ids, "padding_mask": (ids != PAD_ID).astype("int32")}
        if "segment_ids" in backbone.input:
            inputs["segment_ids"] = ids * 0
        hidden, mask = keras.Model(backbone.input, last.input)(inputs)
    _, scores = last(hidden, padding_mask=mask, return_attention_scores=True)
    return ops.convert_to_numpy(scores)
