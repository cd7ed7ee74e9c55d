"""A pipeline model as one TensorFlow graph: ``text: string[N]`` in, the scored columns out.

:func:`write_saved_model` writes a SavedModel whose ``serving_default`` signature does everything ``make score`` does
for the model it is given (``pipeline.model.classifiers``): the unscorable rows' ``score_error``, text cleaning, the
tokenizer's ids with the model's truncation or windows, the Keras model (hashed n-grams included), for NBSVM the
binary 1-3-gram presence through a static lookup table and the naive-Bayes-scaled logistic regression, and for a
fused model the fusion weight. Outputs: ``positive_probability: float32[N]`` (two classes) or
``probabilities: float32[N, k]`` (more), ``predicted_label: string[N]`` and ``score_error: string[N]``; an unscored
row gets NaN, "" and its reason. Loading it needs TensorFlow and tensorflow-text only (their ops).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.model.classifiers import PipelineModel
from pipeline.text.graph_ops import (
    clean_texts,
    text_errors,
)

SIGNATURE = "serving_default"
INPUT = "text"


def serving_function(classifier: PipelineModel, probabilities):
    """``text: string[N]`` -> the scored columns: only the scorable texts reach the model."""
    import tensorflow as tf

    labels = tf.constant(list(classifier.labels), dtype=tf.string)
    k = len(classifier.labels)

    def serve(text):
        errors = text_errors(text)
        scorable = tf.equal(errors, "")
        where = tf.where(scorable)
        scored = tf.reshape(probabilities(clean_texts(tf.boolean_mask(text, scorable))), [-1, k])
        shape = tf.shape(text, out_type=tf.int64)
        full = tf.tensor_scatter_nd_update(tf.fill([shape[0], k], float("nan")), where, scored)
        names = tf.tensor_scatter_nd_update(tf.fill(shape, ""), where, tf.gather(labels, tf.argmax(scored, axis=1)))
        columns = {"positive_probability": full[:, 1]} if k == 2 else {"probabilities": full}
        return {**columns, "predicted_label": names, "score_error": errors}

    return serve


def write_saved_model(classifier: PipelineModel, folder: Path) -> Path:
    """Write ``classifier`` as a SavedModel into ``folder`` (which must not exist); returns it."""
    import keras
    import tensorflow as tf

    tracked, probabilities = classifier.graph(len(classifier.labels))
    archive = keras.export.ExportArchive()
    for resource in tracked:
        archive.track(resource)
    archive.add_endpoint(
        SIGNATURE,
        serving_function(classifier, probabilities),
        input_signature=[tf.TensorSpec([None], tf.string, name=INPUT)],
    )
    archive.write_out(str(folder), verbose=False)
    return folder
