"""Analytic floating-point operation counts of the encoder, for utilisation figures in `make bench`.

Pure arithmetic, no TensorFlow. A multiply-add counts as 2 FLOPs. For one sequence of
``n`` computed positions (padding included: it is computed) through an encoder of width
``d``, ``L`` blocks and feed-forward width ``f``:

- embedding: the token lookup is a gather (no arithmetic); adding positions is ``n d``;
- attention projections (query, key, value, output): ``4 x 2 n d^2`` per block;
- attention scores and the weighted sum of values: ``2 x 2 n^2 d`` per block (all heads together);
- feed-forward: ``2 x 2 n d f`` per block;
- classifier head: ``2 d k`` on the pooled vector;
- masked-LM head (KerasHub ``MaskedLMHead``): a ``d x d`` dense layer and the projection onto
  the ``V``-token vocabulary (tied to the embedding), ``2 m d (d + V)`` for ``m`` masked positions.

Layer norms, softmax, GELU, dropout and the optimizer update are left out: they are
memory-bound element-wise work, a few percent of the total at the widths this project uses,
so leaving them out makes the utilisation figures slight underestimates, never flattery. A
training step counts as 3 forward passes (the backward pass costs about two).
"""

from __future__ import annotations

from dataclasses import dataclass

TRAINING_STEP_FACTOR = 3  # forward + backward (about twice the forward)


@dataclass(frozen=True)
class EncoderShape:
    vocabulary_size: int
    hidden_dim: int
    num_layers: int
    intermediate_dim: int

    @classmethod
    def from_config(cls, model_config, vocabulary_size: int) -> EncoderShape:
        return cls(vocabulary_size, model_config.hidden_dim, model_config.num_layers, model_config.intermediate_dim)


def encoder_flops(shape: EncoderShape, sequence_length: int) -> dict[str, int]:
    """Forward FLOPs of one sequence through the embedding and every block, by part."""
    n, d, f, layers = sequence_length, shape.hidden_dim, shape.intermediate_dim, shape.num_layers
    return {
        "embedding": n * d,
        "attention_projections": layers * 4 * 2 * n * d * d,
        "attention_scores": layers * 2 * 2 * n * n * d,
        "feed_forward": layers * 2 * 2 * n * d * f,
    }


def classifier_forward_flops(shape: EncoderShape, sequence_length: int, num_classes: int) -> int:
    return sum(encoder_flops(shape, sequence_length).values()) + 2 * shape.hidden_dim * num_classes


def masked_lm_forward_flops(shape: EncoderShape, sequence_length: int, masked_positions: int) -> int:
    d = shape.hidden_dim
    return sum(encoder_flops(shape, sequence_length).values()) + 2 * masked_positions * d * (d + shape.vocabulary_size)


def batch_flops(per_sequence: int, batch_size: int, training: bool) -> int:
    """FLOPs of a batch of equally long sequences; a training step is three forward passes."""
    return per_sequence * batch_size * (TRAINING_STEP_FACTOR if training else 1)
