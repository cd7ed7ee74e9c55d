"""Runtime: where and how work runs. ``backend`` (the Keras backend, its devices, what only TensorFlow does),
``hardware`` (TensorFlow's devices, clusters, precision, a worker's role), ``batching`` and ``datasets``
(length-bucketed batches: ``tf.data`` on TensorFlow, a ``PyDataset`` of fixed widths elsewhere) and ``local_http``
(a local server for a while)."""
