"""The Keras fit loop of ``make train``: the optimiser and its schedule, the training data as one typed value, and
``fit`` with resume, early stopping, per-epoch MLflow metrics and, for a pretrained preset, head-first epochs.

``pipeline.stages.train.fit_and_log`` does the stage's work around it: run folders, data loading, the MLflow run,
the outputs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

from pipeline.config import TrainingConfig
from pipeline.core.catalog import BACKUP_DIR
from pipeline.core.errors import ConfigError
from pipeline.model.optimizers import LazyAdamW, lookup_tables
from pipeline.model.preset_classifier import preset_backbone_of
from pipeline.model.progress import MLflowEpochLogger, log_fit_metrics, progress_callbacks
from pipeline.runtime.backend import is_out_of_memory, uses_tensorflow
from pipeline.text.text_tokenizer import TextTokenizer
from pipeline.tracking import metric_history


@dataclass(frozen=True)
class TrainingData:
    text_tokenizer: TextTokenizer
    labels: list[str]
    train_rows: int  # including pseudo-labelled rows
    val_rows: int
    pseudo_label_rows: int
    pseudo_label_run_id: str | None
    train: object  # pipeline.runtime.datasets.make_dataset's: tf.data on TensorFlow, a PyDataset elsewhere
    val: object
    steps_per_epoch: int
    class_weight: dict[int, float] | None
    tokens_per_epoch: int  # non-padding tokens in one pass over train
    soft_targets: bool  # labels are [N, k] probabilities (distillation), not class indices
    padding: dict[str, float]  # padded share of computed positions, full width vs bucketed


@dataclass(frozen=True)
class FitResult:
    history: dict[str, list[float]]
    val_loss: float
    val_accuracy: float
    train_seconds: float


def learning_rate_schedule(training: TrainingConfig, pretrained: bool, steps_per_epoch: int, epochs: int | None = None):
    """Linear warm-up to the peak rate then cosine decay to zero over the whole budget.

    Fine-tuning a pretrained backbone (``make pretrain``'s or a KerasHub preset's) uses its own (lower) rate and
    warm-up (``pretrained``: ``ModelConfig.starts_pretrained``).
    """
    peak = training.fine_tune_learning_rate if pretrained else training.learning_rate
    total = max(1, steps_per_epoch * (training.epochs if epochs is None else epochs))
    warmup = int(total * (training.fine_tune_warmup_fraction if pretrained else training.warmup_fraction))
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else peak,
        decay_steps=max(1, total - warmup),
        warmup_target=peak if warmup else None,
        warmup_steps=warmup,
    )


def compile_model(
    model: keras.Model,
    training: TrainingConfig,
    pretrained: bool,
    steps_per_epoch: int,
    soft_targets: bool = False,
    epochs: int | None = None,
) -> keras.Model:
    """AdamW (lazy on embedding rows with ``training.sparse_updates``) + schedule; cross-entropy on the softmax, for
    any number of classes: sparse on class indices, categorical on soft targets (a teacher's probabilities; gold
    labels then one-hot).

    ``jit_compile`` stays off on TensorFlow (`make bench` measured its XLA training steps slower on a CPU:
    docs/throughput.md); on JAX a step is always one XLA program (off would run it op by op).
    """
    adamw = LazyAdamW if training.sparse_updates else keras.optimizers.AdamW
    optimizer = adamw(
        learning_rate=learning_rate_schedule(training, pretrained, steps_per_epoch, epochs),
        weight_decay=training.weight_decay,
        clipnorm=1.0,
    )
    if soft_targets:
        loss, accuracy = "categorical_crossentropy", keras.metrics.CategoricalAccuracy(name="accuracy")
    else:
        loss, accuracy = "sparse_categorical_crossentropy", keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    if isinstance(optimizer, LazyAdamW):
        optimizer.lookup_tables = lookup_tables(model)
    model.compile(optimizer=optimizer, loss=loss, metrics=[accuracy], jit_compile=not uses_tensorflow())
    return build_optimizer(model)


def build_optimizer(model: keras.Model) -> keras.Model:
    """Create a compiled model's optimizer slots now, not inside the first traced step: TensorFlow traces a step
    that creates variables twice (seconds a run, the same numbers). Keras does this itself only under a
    distribution strategy of its own (built under one, ``model`` is left to it)."""
    own_strategy = False
    if uses_tensorflow():
        import tensorflow as tf

        own_strategy = tf.distribute.has_strategy() or model.distribute_strategy is not tf.distribute.get_strategy()
    if model.built and not model.optimizer.built and not own_strategy:
        model.optimizer.build(model.trainable_variables)
    return model


def balanced_class_weights(labels: np.ndarray, num_classes: int) -> dict[int, float]:
    """``n_samples / (n_classes * count)`` per class (scikit-learn's "balanced")."""
    from sklearn.utils.class_weight import compute_class_weight

    classes = np.arange(num_classes)
    present = np.unique(labels)
    weights = compute_class_weight("balanced", classes=present, y=np.asarray(labels))
    by_class = dict(zip(present.tolist(), weights.tolist()))
    return {int(c): float(by_class.get(c, 1.0)) for c in classes}


# --------------------------------------------------------------------------- stage steps


def fit_head_first(model: keras.Model, data: TrainingData, training: TrainingConfig, run_id: str | None) -> int:
    """``training.freeze_backbone_epochs`` epochs of the new head alone, a preset's backbone frozen, so the random
    head's first gradients do not disturb the pretrained weights; then the whole model is compiled again with its
    own warm-up and decay over the epochs left. Returns the epochs trained (0 without a preset or the setting)."""
    epochs = training.freeze_backbone_epochs
    backbone = preset_backbone_of(model)
    if not epochs or backbone is None:
        return 0
    backbone.trainable = False
    compile_model(model, training, True, data.steps_per_epoch, data.soft_targets, epochs=epochs)
    print(f"train: {epochs} epoch(s) of the classifier head alone, the preset's backbone frozen")
    verbose, progress = progress_callbacks(data.steps_per_epoch)
    model.fit(
        data.train,
        validation_data=data.val,
        epochs=epochs,
        class_weight=data.class_weight,
        shuffle=False,
        callbacks=[*([MLflowEpochLogger(data.tokens_per_epoch)] if run_id else []), *progress],
        verbose=verbose,
    )
    backbone.trainable = True
    compile_model(model, training, True, data.steps_per_epoch, data.soft_targets, epochs=training.epochs - epochs)
    return epochs


def fit(
    model: keras.Model,
    data: TrainingData,
    training: TrainingConfig,
    run_dir: Path,
    run_id: str | None,
    extra_callbacks: Sequence[keras.callbacks.Callback] = (),
) -> FitResult:
    """Train with resume, early stopping (best weights restored) and per-epoch MLflow metrics.

    ``run_id`` None: a non-chief worker of a cluster, which trains and evaluates (every worker
    takes part in each step) but logs nothing.
    """
    verbose, progress = progress_callbacks(data.steps_per_epoch)  # the bar in a terminal, else a line a minute
    callbacks = [
        keras.callbacks.BackupAndRestore(str(run_dir / BACKUP_DIR), delete_checkpoint=True),
        keras.callbacks.EarlyStopping(
            monitor="val_loss", patience=training.early_stopping_patience, restore_best_weights=True
        ),
        *([MLflowEpochLogger(data.tokens_per_epoch)] if run_id else []),
        *extra_callbacks,
        *progress,
    ]
    fit_started = time.perf_counter()
    try:
        frozen = fit_head_first(model, data, training, run_id)
        keras_history = model.fit(
            data.train,
            validation_data=data.val,
            epochs=training.epochs,
            initial_epoch=frozen,
            callbacks=callbacks,
            class_weight=data.class_weight,
            shuffle=False,  # data.train is shuffled by make_dataset
            verbose=verbose,
        )
    except Exception as error:  # the device's memory: the user's setting to change, not a bug
        if not is_out_of_memory(error):
            raise
        raise ConfigError(
            f"out of memory training with training.batch_size={training.batch_size} and "
            f"tokenizer.max_sequence_length={data.text_tokenizer.settings.max_sequence_length}: lower "
            "training.batch_size (or the sequence length, or use a smaller model.preset)"
        ) from None
    train_seconds = time.perf_counter() - fit_started
    val_loss, val_accuracy = model.evaluate(data.val, verbose=0)
    if run_id is None:
        return FitResult(
            {k: list(map(float, v)) for k, v in keras_history.history.items()},
            float(val_loss),
            float(val_accuracy),
            train_seconds,
        )
    history = {key: metric_history(run_id, key) for key in ("loss", "accuracy", "val_loss", "val_accuracy")}
    best_epoch = int(np.argmin(history["val_loss"])) if history["val_loss"] else 0
    log_fit_metrics(
        {
            "best_val_loss": float(val_loss),
            "best_val_accuracy": float(val_accuracy),
            "train_seconds": train_seconds,
            "best_epoch": best_epoch,
        }
    )
    return FitResult(history, float(val_loss), float(val_accuracy), train_seconds)
