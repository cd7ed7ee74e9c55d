"""Runtime: where and how work runs. ``hardware`` (devices, clusters, precision, a worker's role), ``batching`` and
``datasets`` (length-bucketed batches and their ``tf.data`` input) and ``local_http`` (a local server for a while)."""
