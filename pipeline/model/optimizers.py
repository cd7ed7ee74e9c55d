"""AdamW that leaves alone the embedding rows a batch did not use (lazy updates), for the hashed n-gram table.

A look-up's gradient reaches the optimizer as ``tf.IndexedSlices``: the rows the batch read and their gradients.
Keras' Adam turns it into a dense gradient and moves every row of the table each step (its two moments decay,
its weight decay shrinks it), which for the 2^18-row n-gram table is most of a step's time on a CPU. ``LazyAdamW``
updates only the rows read, as TensorFlow Addons' ``LazyAdam`` did: a row's moments and weight decay advance when
the row is used. A row read several times in a batch gets the sum of its gradients, as the dense gradient holds
(Keras' Adam given the sparse gradient squares each occurrence apart for its second moment). Every dense gradient
gets Keras' AdamW unchanged.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from pipeline.model.transformer import PACKAGE


def summed_rows(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    """The same gradient with every row index once (the values of a repeated index summed)."""
    rows, position = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)


@keras.saving.register_keras_serializable(package=PACKAGE)
class LazyAdamW(keras.optimizers.AdamW):
    """``keras.optimizers.AdamW`` with lazy updates of variables whose gradient is sparse (TensorFlow backend)."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        # decoupled weight decay of a sparse-gradient variable happens row by row in update_step, not for every row
        self._sparse_keys = {self._var_key(v) for g, v in zip(grads, trainable_variables)
                             if isinstance(g, tf.IndexedSlices)}
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _use_weight_decay(self, variable):
        if self._var_key(variable) in getattr(self, "_sparse_keys", ()):
            return False
        return super()._use_weight_decay(variable)

    def _clip_by_norm(self, values, axes=None):
        if not isinstance(values, tf.IndexedSlices):
            return super()._clip_by_norm(values, axes)
        rows = summed_rows(values)  # the norm of the dense gradient is the norm of its summed rows
        return tf.IndexedSlices(super()._clip_by_norm(rows.values), rows.indices, rows.dense_shape)

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        rows = summed_rows(gradient)
        index, grad = rows.indices, ops.cast(rows.values, variable.dtype)
        lr = ops.cast(learning_rate, variable.dtype)
        step = ops.cast(self.iterations + 1, variable.dtype)
        beta_1, beta_2 = ops.cast(self.beta_1, variable.dtype), ops.cast(self.beta_2, variable.dtype)
        alpha = lr * ops.sqrt(1 - ops.power(beta_2, step)) / (1 - ops.power(beta_1, step))
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        m_rows = tf.gather(m.value, index)
        v_rows = tf.gather(v.value, index)
        m_rows = m_rows + (grad - m_rows) * (1 - beta_1)
        v_rows = v_rows + (ops.square(grad) - v_rows) * (1 - beta_2)
        self.assign(m, tf.IndexedSlices(m_rows, index, rows.dense_shape))
        self.assign(v, tf.IndexedSlices(v_rows, index, rows.dense_shape))
        change = m_rows * alpha / (ops.sqrt(v_rows) + self.epsilon)
        if self.weight_decay and super()._use_weight_decay(variable):  # AdamW's decay, for the rows used
            change = change + tf.gather(variable, index) * ops.cast(self.weight_decay, variable.dtype) * lr
        self.assign_sub(variable, tf.IndexedSlices(change, index, rows.dense_shape))
