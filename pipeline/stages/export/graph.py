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

from pipeline.core.errors import InputError
from pipeline.core.predictions import FUSION_EPS
from pipeline.lexical import LexicalWeights, nbsvm_weights
from pipeline.model.classifiers import FusedClassifier, LexicalClassifier, PipelineModel, SentimentClassifier
from pipeline.model.forward import forward_pass
from pipeline.stages.export.text_ops import (
    clean_texts,
    padded_rows,
    pool_windows,
    text_errors,
    whitespace_class,
    window_rows,
)

SIGNATURE = "serving_default"
INPUT = "text"


def lexical_module(lexical: LexicalWeights, num_classes: int):
    """A ``tf.Module`` holding the NBSVM's lookup table and weights; calling it on cleaned texts gives float32
    ``[N, num_classes]`` probabilities, as ``LexicalClassifier`` does."""
    import tensorflow as tf

    class Lexical(tf.Module):
        def __init__(self):
            super().__init__(name="nbsvm")
            keys = tf.constant(lexical.features, dtype=tf.string)
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(lexical.features), dtype=tf.int64)), -1
            )
            self.weights = tf.Variable(lexical.weights, trainable=False, name="weights")
            self.intercepts = tf.Variable(lexical.intercepts, trainable=False, name="intercepts")

        def __call__(self, texts):
            if lexical.lowercase:
                texts = tf.strings.lower(texts, encoding="utf-8")
            # the token pattern: runs of word characters (Python's \w: letters, digits, "_"), and "!" and "?" alone
            texts = tf.strings.regex_replace(texts, r"[^\p{L}\p{N}_!?]+", " ")
            tokens = tf.strings.split(tf.strings.regex_replace(texts, r"([!?])", r" \1 "))
            low, high = lexical.ngram_range
            grams = tf.strings.ngrams(tokens, ngram_width=tuple(range(low, high + 1)), separator=" ")
            columns = self.table.lookup(grams)
            rows = tf.cast(columns.value_rowids(), tf.int64)
            found = columns.flat_values >= 0
            width = tf.constant(len(lexical.features), tf.int64)
            present, _ = tf.unique(tf.boolean_mask(rows * width + columns.flat_values, found))  # binary counts
            texts_count = tf.cast(columns.nrows(), tf.int64)
            logits = (
                tf.math.unsorted_segment_sum(tf.gather(self.weights, present % width), present // width, texts_count)
                + self.intercepts
            )
            scores = tf.sigmoid(logits)
            if len(lexical.classes) == 2:
                scores = tf.concat([1.0 - scores, scores], axis=1)
            else:
                scores = scores / tf.maximum(tf.reduce_sum(scores, axis=1, keepdims=True), 1e-12)
            scores = tf.cast(scores, tf.float32)  # LexicalClassifier stores float32, the absent classes 0
            return tf.transpose(
                tf.scatter_nd(lexical.classes[:, None], tf.transpose(scores), [num_classes, texts_count])
            )

    return Lexical()


def class_probabilities(outputs, num_classes: int):
    """``as_class_probabilities``: a model that ends in one sigmoid unit gives ``[1 - p, p]``."""
    import tensorflow as tf

    outputs = tf.cast(outputs, tf.float32)
    if num_classes == 2 and outputs.shape[-1] == 1:
        return tf.concat([1.0 - outputs, outputs], axis=1)
    return outputs


def transformer_function(classifier: SentimentClassifier, num_classes: int):
    """Cleaned texts -> float32 ``[N, k]``: ``SentimentClassifier.prepare`` then ``score``, in-graph."""
    text_tokenizer, model = classifier.text_tokenizer, classifier.model
    s = text_tokenizer.settings

    def probabilities(texts):
        tokens = text_tokenizer.tokenizer(texts)
        ids = padded_rows(
            tokens, s.max_sequence_length, s.truncation, s.head_tokens, text_tokenizer.start_id, text_tokenizer.end_id
        )
        rows = class_probabilities(forward_pass(model, ids), num_classes)
        if not classifier.reads_windows:
            return rows
        ids, owner = window_rows(tokens, s.max_sequence_length, text_tokenizer.start_id)
        return pool_windows(rows, class_probabilities(forward_pass(model, ids), num_classes), owner)

    return probabilities


def row_weights(classifier: FusedClassifier, texts):
    """``FusedClassifier.row_weights`` of cleaned ``texts``: ``float64[N, 1]``, the short weight for texts of at most
    ``short_max_words`` words (runs of non-space characters, as ``str.split`` counts them)."""
    import tensorflow as tf

    if not classifier.short_max_words:
        return tf.fill([tf.shape(texts)[0], 1], tf.constant(classifier.weight, tf.float64))
    space = whitespace_class()
    spaced = tf.strings.regex_replace(tf.strings.regex_replace(texts, f"{space}+", " "), "^ | $", "")
    words = tf.where(
        tf.equal(spaced, ""), tf.zeros_like(texts, tf.int64), tf.strings.split(spaced, sep=" ").row_lengths()
    )
    short = words <= classifier.short_max_words
    return tf.expand_dims(
        tf.where(short, tf.constant(classifier.short_weight, tf.float64), tf.constant(classifier.weight, tf.float64)), 1
    )


def fuse(transformer, lexical, weight):
    """``fuse_probabilities``: the weighted mean of the two log-probabilities, clipped, renormalised (float64);
    ``weight`` one number or ``[N, 1]``."""
    import tensorflow as tf

    transformer, lexical = tf.cast(transformer, tf.float64), tf.cast(lexical, tf.float64)
    if transformer.shape[-1] == 2:
        transformer = tf.stack([1.0 - transformer[:, 1], transformer[:, 1]], axis=1)
        lexical = tf.stack([1.0 - lexical[:, 1], lexical[:, 1]], axis=1)
    logits = weight * tf.math.log(tf.clip_by_value(transformer, FUSION_EPS, 1.0)) + (1.0 - weight) * tf.math.log(
        tf.clip_by_value(lexical, FUSION_EPS, 1.0)
    )
    return tf.cast(tf.nn.softmax(logits, axis=1), tf.float32)


def cascade_rows(lexical, threshold: float):
    """``pipeline.core.predictions.cascade_rows``: the rows whose lexical confidence (float64, for two classes from the
    positive class's probability) is at most ``threshold``."""
    import tensorflow as tf

    positive = tf.cast(lexical, tf.float64)
    confidence = (
        tf.maximum(1.0 - positive[:, 1], positive[:, 1]) if lexical.shape[-1] == 2 else tf.reduce_max(positive, axis=1)
    )
    return confidence <= tf.constant(threshold, tf.float64)


def scoring_parts(classifier: PipelineModel) -> tuple[list, object]:
    """(what to track, cleaned texts -> ``[N, k]``) for any model the pipeline logs."""
    k = len(classifier.labels)
    if isinstance(classifier, SentimentClassifier):
        return [classifier.model], transformer_function(classifier, k)
    if isinstance(classifier, LexicalClassifier):
        lexical = lexical_module(nbsvm_weights(classifier.lexical, "export's graph"), k)
        return [lexical], lexical
    if isinstance(classifier, FusedClassifier):
        weights = (classifier.weight, classifier.short_weight)
        tracked: list = []
        parts: list[object] = []
        if max(weights) > 0:  # as the pyfunc model, a part with weight 0 is not run
            part_tracked, transformer = scoring_parts(classifier.transformer)
            tracked, parts = tracked + part_tracked, parts + [transformer]
        if min(weights) < 1:
            part_tracked, lexical = scoring_parts(classifier.lexical)
            tracked, parts = tracked + part_tracked, parts + [lexical]

        def fused(texts):  # one part alone (a weight of 0 or 1) is run once and fused with itself, as the pyfunc does
            import tensorflow as tf

            first = parts[0](texts)
            last = parts[-1](texts) if len(parts) > 1 else first
            answer = fuse(first, last, row_weights(classifier, texts))
            if len(parts) > 1 and classifier.cascade_threshold is not None:
                # a cascade: the same answers as the pyfunc's (both parts run here: a graph has no faster branch)
                answer = tf.where(
                    cascade_rows(last, classifier.cascade_threshold)[:, None], answer, tf.cast(last, tf.float32)
                )
            return answer

        return tracked, fused
    raise InputError(f"export: no graph form for a {type(classifier).__name__}")


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

    tracked, probabilities = scoring_parts(classifier)
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
