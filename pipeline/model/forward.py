"""The classifier's forward pass over encoded rows: batched by length, compiled with XLA once a shape recurs.

``TextTokenizer.encode`` then :func:`predict_ids` is the single scoring path of evaluation, batch scoring and the
MLflow pyfunc models (``pipeline.model.classifiers``), so the same review gets the same probability from all three.
"""

from __future__ import annotations

import collections
import logging
import weakref
from collections.abc import Sequence

import numpy as np

from pipeline.core.predictions import as_class_probabilities
from pipeline.runtime.backend import uses_tensorflow
from pipeline.runtime.batching import SCORING_LENGTH_MULTIPLE, batch_width, bucketed_batches
from pipeline.text.conventions import PAD_ID
from pipeline.text.text_tokenizer import TextTokenizer

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# model -> Counter of batches scored per (batch size, width): what ``predict_ids`` compiles for
_SHAPE_BATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# a batch shape is compiled once this many of its batches were asked of a model (in one call or over several):
# an XLA compile costs a few eager batches (docs/throughput.md), so a shape met once or
# twice (a few rows, a tiny split) runs eagerly, and one a long input or a server meets again gets compiled
COMPILE_AFTER_BATCHES = 3


def _expected_retracing(record: logging.LogRecord) -> bool:
    """Drop TensorFlow's "triggered tf.function retracing" warning for this module's forward pass:
    one trace per (batch, width) shape is the design, not a mistake a user should be told about."""
    message = record.getMessage()
    return not ("retracing" in message and "compiled_forward" in message)


def compiled_forward(model):
    """``model(ids, training=False)`` compiled with XLA, one executable per input shape, cached per model: a
    ``tf.function`` on TensorFlow, Keras' own jitted ``predict_on_batch`` on JAX.

    Eager calls pay Python and op-dispatch overhead on every batch, and XLA fuses the
    element-wise work (layer norms, GELU, softmax) that dominates a small encoder. Callers keep
    the shapes to a small fixed set (full batches, widths in multiples of ``SCORING_LENGTH_MULTIPLE``);
    each new shape compiles once, in well under a second for the default model here.
    """
    forward = _COMPILED.get(model)
    if forward is None and not uses_tensorflow():  # Keras compiles predict_on_batch with XLA (jax.jit)
        reference = weakref.ref(model)  # the cache must not keep the model alive

        def forward(ids):
            return reference().predict_on_batch(pack_input(reference(), ids))

        _COMPILED[model] = forward
    elif forward is None:
        import tensorflow as tf

        logging.getLogger("tensorflow").addFilter(_expected_retracing)
        reference = weakref.ref(model)  # the cache must not keep the model alive
        forward = tf.function(lambda ids: forward_pass(reference(), ids), jit_compile=True)
        _COMPILED[model] = forward
    return forward


def forward_pass(model, ids):
    """``model(ids, training=False)``, the ids given in the structure the model was built or loaded with: a model
    loaded from a ``.keras`` file expects a list of its one input, and Keras warns at every other call shape."""
    return model(pack_input(model, ids), training=False)


def pack_input(model, ids):
    """``ids`` in the structure ``model`` was built or loaded with (a list of its one input after a load)."""
    import keras

    return keras.tree.pack_sequence_as(model.input, [ids])


def predict_ids(model, ids: np.ndarray, batch_size: int = 256, compiled: bool | None = None) -> np.ndarray:
    """Class probabilities ``[N, k]`` for encoded rows.

    Rows are grouped by length (``pipeline.runtime.batching``) so short reviews are not run through
    the full ``max_sequence_length``; the padding mask makes the result independent of
    padding, which also lets the compiled path pad a short last batch to the full batch size
    (one shape per width). ``compiled=False`` calls the model eagerly, batch by batch: the
    reference path; ``True`` compiles every shape; ``None`` compiles a shape once
    ``COMPILE_AFTER_BATCHES`` of its batches were asked of this model, counting this call's, and runs
    the others eagerly (the two paths agree to float rounding).
    """
    ids = np.asarray(ids, dtype=np.int32)
    classes = as_class_probabilities(np.zeros((1, int(model.output_shape[-1])))).shape[1]
    probabilities = np.empty((len(ids), classes), dtype=np.float32)
    lengths = (ids != PAD_ID).sum(axis=1)
    # a small input is one batch, padded up to a power of two: a bounded set of compiled shapes
    batch_size = min(batch_size, 1 << max(len(ids) - 1, 0).bit_length())
    batches = [
        (rows, batch_width(lengths[rows].max(), SCORING_LENGTH_MULTIPLE, ids.shape[1]))
        for rows in bucketed_batches(lengths, batch_size, seed=None)
    ]
    if compiled is None:
        seen = _SHAPE_BATCHES.setdefault(model, collections.Counter())
        seen.update((batch_size, width) for _, width in batches)
        compiled_widths = {width for _, width in batches if seen[batch_size, width] >= COMPILE_AFTER_BATCHES}
    else:
        compiled_widths = {width for _, width in batches} if compiled else set()
    forward = compiled_forward(model) if compiled_widths else None
    for rows, width in batches:
        batch = ids[rows, :width]
        if width not in compiled_widths:
            probabilities[rows] = as_class_probabilities(forward_pass(model, batch))
        else:
            if forward is None:
                raise ValueError(f"width {width} is to be compiled but no compiled forward pass was made")
            padded = np.pad(batch, ((0, batch_size - len(rows)), (0, 0)), constant_values=PAD_ID)
            probabilities[rows] = as_class_probabilities(forward(padded))[: len(rows)]
    return probabilities


def predict_probabilities(
    model, text_tokenizer: TextTokenizer, texts: Sequence[str], batch_size: int = 256
) -> np.ndarray:
    return predict_ids(model, text_tokenizer.encode(list(texts)), batch_size)
