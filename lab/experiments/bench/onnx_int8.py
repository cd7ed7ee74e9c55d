"""A Keras classifier's forward pass (token ids -> class probabilities) as an ONNX graph with int8 weights, run by
ONNX Runtime on the CPU: the dynamic int8 path ``make bench --only int8`` measures beside Keras' float32 and int8.

ONNX Runtime's dynamic quantization stores every matrix product's constant weights as int8 (one scale per output
column) and quantizes its activations per call, running the products on the CPU's integer instructions. The
converter (tf2onnx, from a ``tf.function``: TensorFlow backend only) writes Keras' ``Dense`` layers on 2-D inputs
as ``Gemm``, which dynamic quantization leaves in float32, and reshapes some weights on every call, which hides them
from the quantizer; so constants are folded (:func:`folded`) and ``Gemm`` written as ``MatMul`` + ``Add``
(:func:`gemm_as_matmul`) first. Embedding tables, layer norms and the attention's activation products stay float32.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from pipeline.core.errors import ConfigError
from pipeline.model.forward import forward_pass
from pipeline.runtime.backend import uses_tensorflow
from pipeline.runtime.batching import SCORING_LENGTH_MULTIPLE, batch_width, bucketed_batches
from pipeline.text.conventions import PAD_ID

ERFC_ONE = "erfc_as_erf/one"
OPSET = 17  # an opset ONNX Runtime 1.32 runs (it runs up to 23)


def onnx_graph(model):
    """``model(ids, training=False)`` for int32 ids ``[batch, width]`` (any batch, any width) as an ONNX model."""
    import tensorflow as tf
    import tf2onnx

    if not uses_tensorflow():
        raise ConfigError("an ONNX graph is converted from TensorFlow: run with KERAS_BACKEND=tensorflow")
    signature = [tf.TensorSpec([None, None], tf.int32, name="token_ids")]
    forward = tf.function(lambda ids: forward_pass(model, ids), input_signature=signature)
    graph, _ = tf2onnx.convert.from_function(forward, input_signature=signature, opset=OPSET)
    return erfc_as_erf(graph)


def erfc_as_erf(graph):
    """``graph`` with every ``Erfc`` (TensorFlow's exact GELU; tf2onnx leaves it, ONNX has no such operator) written
    as ``1 - Erf``, in place."""
    from onnx import helper, numpy_helper

    nodes = []
    for node in graph.graph.node:
        if node.op_type != "Erfc":
            nodes.append(node)
            continue
        error = node.output[0] + "/erf"
        nodes.append(helper.make_node("Erf", [node.input[0]], [error], name=node.name + "/erf"))
        nodes.append(helper.make_node("Sub", [ERFC_ONE, error], list(node.output), name=node.name + "/one_minus"))
    if len(nodes) > len(graph.graph.node):
        graph.graph.initializer.append(numpy_helper.from_array(np.ones((), dtype=np.float32), ERFC_ONE))
        del graph.graph.node[:]
        graph.graph.node.extend(nodes)
    return graph


def gemm_as_matmul(graph):
    """``graph`` with every ``Gemm`` whose weights are a constant (``x @ W [+ b]``, no transposed ``x``, no scaling)
    written as ``MatMul`` [+ ``Add``], so dynamic quantization covers it; other nodes as they were."""
    import onnx
    from onnx import helper, numpy_helper

    graph = onnx.ModelProto.FromString(graph.SerializeToString())  # a copy: the caller's graph stays as it was
    constants = {tensor.name: tensor for tensor in graph.graph.initializer}
    nodes = []
    for node in graph.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = (
            node.op_type == "Gemm"
            and node.input[1] in constants
            and not attributes.get("transA", 0)
            and attributes.get("alpha", 1.0) == 1.0
            and (len(node.input) < 3 or attributes.get("beta", 1.0) == 1.0)
        )
        if not plain:
            nodes.append(node)
            continue
        weights = node.input[1]
        if attributes.get("transB", 0):  # a transposed copy, once: another node may read the weights as they are
            transposed = weights + "/transposed"
            if transposed not in constants:
                array = numpy_helper.to_array(constants[weights]).T.copy()
                constants[transposed] = numpy_helper.from_array(array, transposed)
                graph.graph.initializer.append(constants[transposed])
            weights = transposed
        product = node.output[0] + "/matmul"
        nodes.append(helper.make_node("MatMul", [node.input[0], weights], [product], name=node.name + "/matmul"))
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("Add", [product, node.input[2]], list(node.output), name=node.name + "/add"))
        else:
            nodes.append(helper.make_node("Identity", [product], list(node.output), name=node.name + "/identity"))
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    return graph


def folded(graph, path: Path):
    """``graph`` after ONNX Runtime's basic optimizations (written to ``path`` and read back): constants folded, so a
    weight the converter reshapes or transposes on every call is a constant the quantizer can see."""
    import onnx

    session(graph, optimized_to=path)
    return onnx.load(path)


def int8_graph(graph):
    """``graph`` with int8 weights in every ``MatMul`` on a constant (per output channel; activations quantized
    per call): ONNX Runtime's dynamic quantization, after :func:`folded` and :func:`gemm_as_matmul`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder:  # quantize_dynamic reads and writes files
        source, target = Path(folder) / "float32.onnx", Path(folder) / "int8.onnx"
        onnx.save(gemm_as_matmul(folded(graph, Path(folder) / "folded.onnx")), source)
        root = logging.getLogger()
        root.addFilter(_no_preprocessing_advice)
        try:
            quantize_dynamic(
                source,
                target,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        finally:
            root.removeFilter(_no_preprocessing_advice)
        return onnx.load(target)


def _no_preprocessing_advice(record: logging.LogRecord) -> bool:
    """Drop the quantizer's advice to run its pre-processing first: :func:`folded` does its constant folding, and
    the tensors whose type it would infer are given one (``DefaultTensorType``)."""
    return "pre-processing before quantization" not in record.getMessage()


def session(graph, optimized_to: Path | None = None):
    """An ONNX Runtime CPU session of ``graph``; with ``optimized_to``, only its basic optimizations, the optimized
    graph written there."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # its per-tensor "could not infer type" notes are not a user's business
    if optimized_to is not None:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(optimized_to)
    return onnxruntime.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])


def predict_ids_onnx(runner, ids: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Class probabilities ``[N, k]`` of encoded rows from an ONNX Runtime session, in batches grouped by length
    and cut to their longest row, as ``pipeline.model.forward.predict_ids`` groups them (any shape runs: no
    compiled shapes to keep few)."""
    ids = np.asarray(ids, dtype=np.int32)
    name = runner.get_inputs()[0].name
    lengths = (ids != PAD_ID).sum(axis=1)
    probabilities = None
    for rows in bucketed_batches(lengths, batch_size, seed=None):
        width = batch_width(lengths[rows].max(), SCORING_LENGTH_MULTIPLE, ids.shape[1])
        batch = runner.run(None, {name: ids[rows, :width]})[0]
        if probabilities is None:
            probabilities = np.empty((len(ids), batch.shape[1]), dtype=np.float32)
        probabilities[rows] = batch
    return probabilities if probabilities is not None else np.empty((0, 0), dtype=np.float32)
