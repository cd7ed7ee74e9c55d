"""AdamW that leaves alone the embedding rows a batch did not use (lazy updates), for the hashed n-gram table.

A look-up's gradient reaches the optimizer as ``tf.IndexedSlices``: the rows the batch read and their gradients.
Keras' Adam turns it into a dense gradient and moves every row of the table each step (its two moments decay,
its weight decay shrinks it), which for the 2^18-row n-gram table is most of a step's time on a CPU. ``LazyAdamW``
updates only the rows read, as TensorFlow Addons' ``LazyAdam`` did: a row's moments and weight decay advance when
the row is used. A row read several times in a batch gets the sum of its gradients, as the dense gradient holds
(Keras' Adam given the sparse gradient squares each occurrence apart for its second moment). Every dense gradient
gets Keras' AdamW unchanged.

Off TensorFlow (JAX), a look-up's gradient is dense: there the tables TensorFlow gets sparse gradients for (those of
``keras.layers.Embedding`` layers, :func:`lookup_tables`; not position embeddings, which are sliced) get the same
rule as a dense update masked to the rows whose gradient is not zero, the rows a batch read (a row read whose
gradient sums to exactly zero also stays): the same arithmetic, without the saving in time.
"""

from __future__ import annotations

import keras
from keras import ops

from pipeline.model.transformer import PACKAGE


def summed_rows(gradient):
    """The same ``tf.IndexedSlices`` gradient with every row index once (the values of a repeated index summed)."""
    import tensorflow as tf

    rows, position = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, gradient.dense_shape)


def lookup_tables(model) -> frozenset[str]:
    """The paths of ``model``'s look-up tables: the variables of its ``keras.layers.Embedding`` layers (KerasHub's
    token embeddings included), whose gradient TensorFlow hands the optimizer as ``tf.IndexedSlices``."""
    return frozenset(
        variable.path
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.Embedding)
        for variable in layer.trainable_variables
    )


@keras.saving.register_keras_serializable(package=PACKAGE)
class LazyAdamW(keras.optimizers.AdamW):
    """``keras.optimizers.AdamW`` with lazy updates of variables whose gradient is sparse (TensorFlow backend), or
    of embedding tables (any other backend)."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        # decoupled weight decay of a lazily updated variable happens row by row in update_step, not for every row
        self._sparse_keys = {self._var_key(v) for g, v in zip(grads, trainable_variables) if self._lazy(g, v)}
        return super()._backend_apply_gradients(grads, trainable_variables)

    @staticmethod
    def _is_sparse(gradient) -> bool:
        return type(gradient).__name__ == "IndexedSlices"

    def _lazy(self, gradient, variable) -> bool:
        if keras.backend.backend() == "tensorflow":
            return self._is_sparse(gradient)
        return variable.path in self.lookup_tables

    lookup_tables: frozenset[str] = frozenset()  # off TensorFlow: paths of the variables updated lazily

    def _use_weight_decay(self, variable):
        if self._var_key(variable) in getattr(self, "_sparse_keys", ()):
            return False
        return super()._use_weight_decay(variable)

    def _clip_by_norm(self, values, axes=None):
        if not self._is_sparse(values):
            return super()._clip_by_norm(values, axes)
        import tensorflow as tf

        rows = summed_rows(values)  # the norm of the dense gradient is the norm of its summed rows
        return tf.IndexedSlices(super()._clip_by_norm(rows.values), rows.indices, rows.dense_shape)

    def update_step(self, gradient, variable, learning_rate):
        if not self._is_sparse(gradient):
            if self._var_key(variable) in getattr(self, "_sparse_keys", ()):
                return self._masked_update(gradient, variable, learning_rate)
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        rows = summed_rows(gradient)
        index, grad = rows.indices, ops.cast(rows.values, variable.dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        m_rows, v_rows, change = self._lazy_rule(
            variable,
            learning_rate,
            grad,
            tf.gather(m.value, index),
            tf.gather(v.value, index),
            tf.gather(variable, index),
        )
        self.assign(m, tf.IndexedSlices(m_rows, index, rows.dense_shape))
        self.assign(v, tf.IndexedSlices(v_rows, index, rows.dense_shape))
        self.assign_sub(variable, tf.IndexedSlices(change, index, rows.dense_shape))

    def _masked_update(self, gradient, variable, learning_rate):
        """The lazy rule on a dense gradient: rows whose gradient is zero (not read) keep their weights and moments."""
        grad = ops.cast(gradient, variable.dtype)
        used = ops.any(ops.not_equal(grad, 0), axis=-1, keepdims=True)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        new_m, new_v, change = self._lazy_rule(variable, learning_rate, grad, m.value, v.value, variable.value)
        self.assign(m, ops.where(used, new_m, m.value))
        self.assign(v, ops.where(used, new_v, v.value))
        self.assign_sub(variable, ops.where(used, change, ops.zeros_like(change)))

    def _lazy_rule(self, variable, learning_rate, grad, m_rows, v_rows, weights):
        """Adam's moments and AdamW's change for the rows given (their gradient, moments and weights)."""
        lr = ops.cast(learning_rate, variable.dtype)
        step = ops.cast(self.iterations + 1, variable.dtype)
        beta_1, beta_2 = ops.cast(self.beta_1, variable.dtype), ops.cast(self.beta_2, variable.dtype)
        alpha = lr * ops.sqrt(1 - ops.power(beta_2, step)) / (1 - ops.power(beta_1, step))
        m_rows = m_rows + (grad - m_rows) * (1 - beta_1)
        v_rows = v_rows + (ops.square(grad) - v_rows) * (1 - beta_2)
        change = m_rows * alpha / (ops.sqrt(v_rows) + self.epsilon)
        if self.weight_decay and super()._use_weight_decay(variable):  # AdamW's decay, for the rows used
            change = change + weights * ops.cast(self.weight_decay, variable.dtype) * lr
        return m_rows, v_rows, change
