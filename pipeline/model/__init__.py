"""Model: the Keras classifier and what it is scored through. ``transformer`` (pure construction, serializable
layers), ``preset_classifier`` (a pretrained KerasHub encoder's backbone under the same head), ``assembly`` (which
of them training fits), ``fit`` (the fit loop), ``optimizers``, ``adversarial``, ``flops``, ``forward`` (the
batched, compiled forward pass) and ``classifiers`` (the MLflow pyfunc models every stage logs and loads:
Transformer, lexical, fused)."""
