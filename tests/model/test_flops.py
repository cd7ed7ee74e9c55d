from pipeline.config import ModelConfig
from pipeline.model.flops import (
    EncoderShape,
    batch_flops,
    classifier_forward_flops,
    encoder_flops,
    masked_lm_forward_flops,
)


def test_tiny_encoder_against_a_hand_count():
    # vocabulary 10, width 2, one block, feed-forward 3, sequence of 4 tokens, 2 classes
    shape = EncoderShape(vocabulary_size=10, hidden_dim=2, num_layers=1, intermediate_dim=3)
    parts = encoder_flops(shape, 4)
    assert parts["embedding"] == 4 * 2  # position add
    assert parts["attention_projections"] == 4 * (2 * 4 * 2 * 2)  # q, k, v, o: [4x2] @ [2x2] each
    assert parts["attention_scores"] == 2 * (2 * 4 * 4 * 2)  # q k^T: [4x2] @ [2x4]; weights v: [4x4] @ [4x2]
    assert parts["feed_forward"] == 2 * 4 * 2 * 3 + 2 * 4 * 3 * 2  # [4x2] @ [2x3], then [4x3] @ [3x2]
    encoder = 8 + 128 + 128 + 96
    assert classifier_forward_flops(shape, 4, num_classes=2) == encoder + 2 * 2 * 2
    # one masked position: dense [1x2] @ [2x2], then tied projection [1x2] @ [2x10]
    assert masked_lm_forward_flops(shape, 4, masked_positions=1) == encoder + 2 * 2 * 2 + 2 * 2 * 10


def test_blocks_and_batches_scale_linearly_and_training_is_three_passes():
    one = EncoderShape(100, 8, 1, 16)
    two = EncoderShape(100, 8, 2, 16)
    assert encoder_flops(two, 16)["feed_forward"] == 2 * encoder_flops(one, 16)["feed_forward"]
    assert batch_flops(1000, batch_size=4, training=False) == 4000
    assert batch_flops(1000, batch_size=4, training=True) == 12000


def test_shape_from_model_config():
    config = ModelConfig(hidden_dim=32, num_layers=3, num_heads=4, intermediate_dim=64)
    assert EncoderShape.from_config(config, 500) == EncoderShape(500, 32, 3, 64)
