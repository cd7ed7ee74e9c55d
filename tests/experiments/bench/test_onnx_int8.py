"""The ONNX Runtime path of ``make bench --only int8`` (``lab.experiments.bench.onnx_int8``) on the tiny preset's
classifier: its float32 graph answers as Keras does, its int8 graph quantizes every weight product and stays close, a
saved and loaded int8 graph answers the same, and the Gemm rewrite keeps a graph's answers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.tiny_preset import write_tiny_preset


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    """A classifier on the tiny two-block preset, and rows of ids of several lengths (padding after each)."""
    import keras

    from pipeline.config import ModelConfig
    from pipeline.model.preset_classifier import build_preset_model, load_preset_backbone

    folder = write_tiny_preset(tmp_path_factory.mktemp("onnx") / "preset")
    keras.utils.set_random_seed(0)
    model_config = ModelConfig(preset=str(folder), pooling="mean", ngram_max=1)
    model = build_preset_model(model_config, load_preset_backbone(str(folder)))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50, size=(40, 24)).astype(np.int32)  # the tiny vocabulary has 55 entries
    ids[:, 0] = 2
    for row, length in enumerate(rng.integers(3, 25, size=len(ids))):
        ids[row, length:] = 0
    return model, ids


def test_the_float32_graph_answers_as_keras_does(tiny_classifier):
    from lab.experiments.bench.onnx_int8 import onnx_graph, predict_ids_onnx, session
    from pipeline.model.forward import predict_ids

    model, ids = tiny_classifier
    keras_probabilities = predict_ids(model, ids, compiled=True)
    onnx_probabilities = predict_ids_onnx(session(onnx_graph(model)), ids, batch_size=16)
    assert onnx_probabilities.shape == keras_probabilities.shape == (len(ids), 2)
    np.testing.assert_allclose(onnx_probabilities, keras_probabilities, atol=1e-5)


def test_the_int8_graph_quantizes_every_weight_product_and_answers_close_to_float32(tiny_classifier, tmp_path):
    import onnx

    from lab.experiments.bench.onnx_int8 import int8_graph, onnx_graph, predict_ids_onnx, session

    model, ids = tiny_classifier
    graph = onnx_graph(model)
    quantized = int8_graph(graph)
    constants = {tensor.name for tensor in quantized.graph.initializer}
    operations = [node.op_type for node in quantized.graph.node]
    # the classifier's weight products: 6 per block (query, key, value, attention output, two feed-forward), the head
    assert operations.count("MatMulInteger") >= 2 * 6 + 1
    left = [n.name for n in quantized.graph.node if n.op_type in ("Gemm", "MatMul") and n.input[1] in constants]
    assert left == []  # no product with constant weights stayed float32
    assert [n.op_type for n in graph.graph.node].count("MatMulInteger") == 0  # the float graph was not changed
    floats = predict_ids_onnx(session(graph), ids)
    ints = predict_ids_onnx(session(quantized), ids)
    difference = np.abs(ints - floats).max()
    assert 0 < difference < 0.05, difference  # int8 weights move a probability a little
    path = tmp_path / "int8.onnx"
    onnx.save(quantized, path)
    np.testing.assert_array_equal(predict_ids_onnx(session(onnx.load(path)), ids), ints)  # saved and loaded: the same


def test_a_gemm_with_constant_weights_becomes_matmul_and_add_with_the_same_answers():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from lab.experiments.bench.onnx_int8 import gemm_as_matmul, session

    rng = np.random.default_rng(1)
    weights = rng.normal(size=(4, 3)).astype(np.float32)  # transB=1: [out, in]
    bias = rng.normal(size=4).astype(np.float32)
    graph = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="dense"),
                helper.make_node("Gemm", ["y", "x2"], ["z"], name="two_inputs"),  # B is an input: left alone
            ],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3]),
                helper.make_tensor_value_info("x2", TensorProto.FLOAT, [4, 2]),
            ],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 2])],
            [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    rewritten = gemm_as_matmul(graph)
    assert [n.op_type for n in rewritten.graph.node] == ["MatMul", "Add", "Gemm"]
    assert [n.op_type for n in graph.graph.node] == ["Gemm", "Gemm"]  # the caller's graph as it was
    kept = {tensor.name: numpy_helper.to_array(tensor) for tensor in rewritten.graph.initializer}
    np.testing.assert_array_equal(kept["w"], weights)  # transposed into a copy: another reader of "w" sees it as it was
    np.testing.assert_array_equal(kept["w/transposed"], weights.T)
    onnx.checker.check_model(rewritten)
    feeds = {"x": rng.normal(size=(5, 3)).astype(np.float32), "x2": rng.normal(size=(4, 2)).astype(np.float32)}
    np.testing.assert_allclose(
        session(rewritten).run(None, feeds)[0], session(graph).run(None, feeds)[0], rtol=1e-5, atol=1e-6
    )
