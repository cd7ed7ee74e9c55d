"""Adversarial training on the embeddings (Miyato, Dai and Goodfellow 2017, "Adversarial Training Methods for
Semi-Supervised Text Classification"), ``training.adversarial_epsilon``.

Each training step also scores every review with its normalised embeddings moved a distance ``epsilon`` along the
gradient of the loss (the direction that hurts the model most, to first order), and adds that loss to the clean one:
the model learns to answer the same for every review within ``epsilon`` of the real one. The perturbation is the
gradient divided by its L2 norm over the whole review (all positions and dimensions), as in the paper; it is applied
to the output of ``embedding_norm`` (token + n-gram vectors plus positions, layer-normalised, so the scale of
``epsilon`` is that of a review of unit-variance vectors). Validation, evaluation and every scorer see the plain
classifier: only ``AdversarialClassifier.classifier`` is saved.
"""

from __future__ import annotations

import keras

EMBEDDING_OUTPUT_LAYER = "embedding_norm"


class AdversarialClassifier(keras.Model):
    """A classifier built by ``pipeline.model.transformer.build_model`` for ``fit`` with adversarial perturbations:
    the same layers and weights (``classifier``), a loss with the perturbed reviews' loss added while training.

    Built on Keras' documented extension point, ``compute_loss``: ``fit``'s own step computes the clean prediction,
    this adds the adversarial term inside the same gradient tape."""

    def __init__(self, classifier: keras.Model, epsilon: float, **kwargs):
        super().__init__(name=classifier.name, **kwargs)
        if epsilon <= 0:
            raise ValueError(f"AdversarialClassifier needs epsilon > 0, got {epsilon}")
        self.classifier, self.epsilon = classifier, float(epsilon)
        embedded = classifier.get_layer(EMBEDDING_OUTPUT_LAYER).output
        mask = classifier.get_layer("padding_mask").output
        # two views of the classifier's own graph and layers: ids -> embeddings, embeddings -> probabilities
        self._parts = (
            keras.Model(classifier.input, [embedded, mask]),
            keras.Model([embedded, mask], classifier.output),
        )
        self.built = True

    def call(self, inputs, training=None):
        return self.classifier(inputs, training=training)

    def perturbed_loss(self, x, y, sample_weight=None):
        """The loss of ``x`` with its embeddings moved ``epsilon`` along the loss gradient (that direction held
        constant: ``stop_gradient``, as in the paper). TensorFlow only (``pipeline.runtime.backend`` refuses it
        elsewhere before anything is built)."""
        import tensorflow as tf

        embed, head = self._parts
        embedded, mask = embed(x, training=True)
        with tf.GradientTape() as tape:
            tape.watch(embedded)
            clean = super().compute_loss(x, y, head([embedded, mask], training=True), sample_weight, training=True)
        gradient = tf.stop_gradient(tape.gradient(clean, embedded))
        norm = tf.sqrt(tf.reduce_sum(tf.square(gradient), axis=[1, 2], keepdims=True) + 1e-12)
        shift = tf.cast(self.epsilon, embedded.dtype) * tf.cast(gradient / norm, embedded.dtype)
        return super().compute_loss(x, y, head([embedded + shift, mask], training=True), sample_weight, training=True)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        if not training:
            return loss
        return loss + self.perturbed_loss(x, y, sample_weight)


def classifier_of(model: keras.Model) -> keras.Model:
    """The plain classifier to save, score and evaluate: ``model`` itself, or the one an adversarial wrapper holds."""
    return model.classifier if isinstance(model, AdversarialClassifier) else model
