"""Training stage: the Transformer classifier on tokenized IMDB, tracked in MLflow.

Reads:  ``data/tokenize/`` (ids, labels, vocabulary, manifest).
Writes: ``data/train/<pooling>-<position>-seed<seed>-<hash>/`` holding ``model.keras``,
        the tokenizer files, ``history.json``, ``training_curves.png`` and ``manifest.json``
        (with the MLflow run id); the same run in MLflow with params, tags, per-epoch
        metrics, the curves, the dataset inputs and a pyfunc model scoring raw strings.

A killed run resumes from its last finished epoch (``keras.callbacks.BackupAndRestore``)
and continues the same MLflow run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Sequence

import keras
import mlflow
import numpy as np
import pandas as pd
import tensorflow as tf

from pipeline.artifacts import atomic_write_json, build_manifest, is_up_to_date, manifest_hash, read_manifest
from pipeline.config import Config
from pipeline.inference import LABELS_FILE, SentimentClassifier, load_labels
from pipeline.model import build_model
from pipeline.tokenization import PAD_ID, SETTINGS_FILE, VOCABULARY_FILE, TextEncoder, load_split
from pipeline.tracking import MLflowEpochLogger, flat_params, setup_tracking, standard_tags

STAGE = "train"
MODEL_FILE = "model.keras"
RUN_ID_FILE = "mlflow_run_id.txt"
PYFUNC_REQUIREMENTS = ["tensorflow", "tensorflow-text", "keras>=3", "keras-hub", "mlflow", "pandas", "numpy"]


# --------------------------------------------------------------------------- hardware


def choose_hardware(precision: str) -> tuple[tf.distribute.Strategy, str, str]:
    """(distribution strategy, Keras dtype policy, a description to log)."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) > 1:
        strategy: tf.distribute.Strategy = tf.distribute.MirroredStrategy()
        device = f"{len(gpus)} GPUs (MirroredStrategy)"
    else:
        strategy = tf.distribute.get_strategy()
        device = "1 GPU" if gpus else f"CPU ({os.cpu_count()} cores)"
    if precision == "auto":
        # On this project's 2-core AVX512_BF16 CPU, bfloat16 was measured slower than float32
        # for the default model (332 vs 299 ms/step), so the CPU default is float32.
        policy = "mixed_float16" if gpus else "float32"
    else:
        policy = precision
    return strategy, policy, device


# --------------------------------------------------------------------------- pure helpers


def run_name(config: Config) -> str:
    return f"{config.model.pooling}-{config.model.position}-seed{config.training.seed}"


def learning_rate_schedule(config: Config, steps_per_epoch: int):
    """Linear warm-up to ``learning_rate`` then cosine decay to zero over the whole budget."""
    total = max(1, steps_per_epoch * config.training.epochs)
    warmup = int(total * config.training.warmup_fraction)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.training.learning_rate,
        decay_steps=max(1, total - warmup),
        warmup_target=config.training.learning_rate if warmup else None,
        warmup_steps=warmup,
    )


def make_dataset(ids: np.ndarray, labels: np.ndarray, batch_size: int, shuffle_seed: int | None = None,
                 shuffle_buffer: int = 0, num_classes: int = 2) -> tf.data.Dataset:
    targets = np.asarray(labels, dtype=np.float32 if num_classes == 2 else np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((np.asarray(ids), targets))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(min(shuffle_buffer, len(ids)) or len(ids), seed=shuffle_seed,
                                  reshuffle_each_iteration=True)
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def compile_model(model: keras.Model, config: Config, steps_per_epoch: int, num_classes: int = 2) -> keras.Model:
    """AdamW + schedule; binary cross-entropy for two classes, sparse categorical for more.

    ``jit_compile`` stays off: XLA made a training step about 15x slower on this CPU.
    """
    optimizer = keras.optimizers.AdamW(learning_rate=learning_rate_schedule(config, steps_per_epoch),
                                       weight_decay=config.training.weight_decay, clipnorm=1.0)
    if num_classes == 2:
        loss, accuracy = "binary_crossentropy", keras.metrics.BinaryAccuracy(name="accuracy")
    else:
        loss, accuracy = "sparse_categorical_crossentropy", keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    model.compile(optimizer=optimizer, loss=loss, metrics=[accuracy], jit_compile=False)
    return model


def balanced_class_weights(labels: np.ndarray, num_classes: int) -> dict[int, float]:
    """``n_samples / (n_classes * count)`` per class (scikit-learn's "balanced")."""
    from sklearn.utils.class_weight import compute_class_weight

    classes = np.arange(num_classes)
    present = np.unique(labels)
    weights = compute_class_weight("balanced", classes=present, y=np.asarray(labels))
    by_class = dict(zip(present.tolist(), weights.tolist()))
    return {int(c): float(by_class.get(c, 1.0)) for c in classes}


def plot_training_curves(history: dict[str, list[float]], path: Path, title: str) -> Path:
    from pipeline.plots import new_figure, save_figure

    figure, (loss_axis, accuracy_axis) = new_figure(width=10, height=4, ncols=2)
    epochs = np.arange(1, len(history.get("loss", [])) + 1)
    for key, axis in (("loss", loss_axis), ("accuracy", accuracy_axis)):
        axis.plot(epochs, history.get(key, []), marker="o", label=f"train {key}")
        axis.plot(epochs, history.get(f"val_{key}", []), marker="o", label=f"validation {key}")
        axis.set(xlabel="epoch", ylabel=key, title=f"{title}: {key}")
        axis.legend()
    return save_figure(figure, path)


def history_from_mlflow(run_id: str) -> dict[str, list[float]]:
    """Per-epoch metrics of a run as logged (covers epochs from before a resume too)."""
    client = mlflow.tracking.MlflowClient()
    history = {}
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        points = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        by_step = {m.step: m.value for m in points}
        history[key] = [by_step[s] for s in sorted(by_step)]
    return history


# --------------------------------------------------------------------------- stage entry point


def run_directory(config: Config, tokenize_dir: Path) -> tuple[Path, str, dict[str, str]]:
    inputs = {"tokenize_manifest_sha256": manifest_hash(tokenize_dir)}
    config_hash = config.section_hash("model", "training")
    key = f"{run_name(config)}-{config_hash[:8]}-{inputs['tokenize_manifest_sha256'][:8]}"
    return config.data_dir / STAGE / key, config_hash, inputs


def log_pyfunc_model(run_dir: Path, example_texts: Sequence[str]) -> str:
    """Log the pyfunc model (Keras file + tokenizer inside its artifacts); returns its model URI."""
    package_dir = Path(__file__).resolve().parent
    example = pd.DataFrame({"text": list(example_texts)})
    # The signature comes from a loaded copy; the logged instance must stay empty so the
    # Keras model is not cloudpickled into it (it is loaded from the artifacts instead).
    loaded = SentimentClassifier()
    loaded.load_context(type("Context", (), {"artifacts": {
        "keras_model": str(run_dir / MODEL_FILE), "tokenizer": str(run_dir / "tokenizer")}})())
    signature = mlflow.models.infer_signature(example, loaded.predict(None, example))
    info = mlflow.pyfunc.log_model(
        name="model",
        python_model=SentimentClassifier(),
        artifacts={"keras_model": str(run_dir / MODEL_FILE), "tokenizer": str(run_dir / "tokenizer")},
        code_paths=[str(package_dir)],
        signature=signature,
        input_example=example,
        pip_requirements=PYFUNC_REQUIREMENTS,
    )
    return info.model_uri


def run(config: Config, force: bool = False, extra_callbacks: Sequence[keras.callbacks.Callback] = ()) -> Path:
    """Train one model; returns its folder. Skips when an identical finished run exists."""
    started = time.perf_counter()
    tokenize_dir = config.data_dir / "tokenize"
    if not (tokenize_dir / "manifest.json").is_file():
        raise FileNotFoundError(f"no tokenize output in {tokenize_dir}/: run `make tokenize` first")
    run_dir, config_hash, inputs = run_directory(config, tokenize_dir)
    if not force and is_up_to_date(run_dir, config_hash, inputs, [MODEL_FILE]):
        manifest = read_manifest(run_dir)
        print(f"train: up to date, nothing to do ({run_dir}/, MLflow run {manifest['mlflow_run_id']})")
        return run_dir
    if force and not (run_dir / "backup").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)

    keras.utils.set_random_seed(config.training.seed)
    strategy, policy, device = choose_hardware(config.training.precision)
    keras.mixed_precision.set_global_policy(policy)
    devices = [d.name.replace("/physical_device:", "") for d in tf.config.list_physical_devices()]
    print(f"train: devices {devices}; using {device}, precision {policy}")

    encoder = TextEncoder.load(tokenize_dir)
    labels = load_labels(tokenize_dir)
    num_classes = len(labels)
    train_ids, train_labels = load_split(tokenize_dir, "train")
    val_ids, val_labels = load_split(tokenize_dir, "val")
    if config.training.max_train_samples:
        train_ids = train_ids[: config.training.max_train_samples]
        train_labels = train_labels[: config.training.max_train_samples]
    replicas = strategy.num_replicas_in_sync
    batch_size = config.training.batch_size * replicas
    steps_per_epoch = -(-len(train_ids) // batch_size)
    train_data = make_dataset(train_ids, train_labels, batch_size, config.training.seed, config.training.shuffle_buffer,
                              num_classes)
    val_data = make_dataset(val_ids, val_labels, batch_size * 4, num_classes=num_classes)
    class_weight = balanced_class_weights(train_labels, num_classes) if config.training.class_weights else None
    tokens_per_epoch = int((np.asarray(train_ids) != PAD_ID).sum())

    with strategy.scope():
        model = build_model(config.model, encoder.vocabulary_size, encoder.settings.max_sequence_length, num_classes)
        compile_model(model, config, steps_per_epoch, num_classes)

    setup_tracking(config)
    run_id_path = run_dir / RUN_ID_FILE
    resume_run_id = run_id_path.read_text().strip() if run_id_path.is_file() and (run_dir / "backup").exists() else None
    parent = mlflow.active_run()
    with mlflow.start_run(run_id=resume_run_id, run_name=None if resume_run_id else run_name(config),
                          nested=parent is not None) as active:
        run_id = active.info.run_id
        run_id_path.write_text(run_id)
        if resume_run_id:
            print(f"train: resuming MLflow run {run_id} from {run_dir}/backup")
        else:
            mlflow.log_params({**flat_params(config), "device": device, "precision_policy": policy,
                               "vocabulary_size": encoder.vocabulary_size, "train_rows": len(train_ids),
                               "num_classes": num_classes, "class_weight": str(class_weight),
                               "parameters": model.count_params()})
            mlflow.set_tags(standard_tags(config, config_hash, STAGE, device=device, precision=policy,
                                          devices=",".join(devices),
                                          tokenize_manifest=inputs["tokenize_manifest_sha256"][:16],
                                          ingest_manifest=read_manifest(tokenize_dir)["inputs"]["ingest_manifest_sha256"][:16]))
            ingest_dir = config.data_dir / "ingest"
            for split, context in (("train", "training"), ("val", "validation")):
                frame = pd.read_parquet(ingest_dir / f"{split}.parquet", columns=["review_id", "label", "rating"])
                mlflow.log_input(mlflow.data.from_pandas(frame, source=str(ingest_dir / f"{split}.parquet"),
                                                         name=f"imdb-{split}", targets="label"), context=context)
            mlflow.log_artifact(str(tokenize_dir / "token_lengths.png"), "data")

        callbacks = [
            keras.callbacks.BackupAndRestore(str(run_dir / "backup"), delete_checkpoint=True),
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=config.training.early_stopping_patience,
                                          restore_best_weights=True),
            MLflowEpochLogger(tokens_per_epoch),
            *extra_callbacks,
        ]
        fit_started = time.perf_counter()
        model.fit(train_data, validation_data=val_data, epochs=config.training.epochs, callbacks=callbacks,
                  class_weight=class_weight, shuffle=False,  # train_data is already shuffled by tf.data
                  verbose=1 if os.environ.get("PIPELINE_QUIET") is None else 2)
        train_seconds = time.perf_counter() - fit_started

        val_loss, val_accuracy = model.evaluate(val_data, verbose=0)
        history = history_from_mlflow(run_id)
        best_epoch = int(np.argmin(history["val_loss"])) if history["val_loss"] else 0
        mlflow.log_metrics({"best_val_loss": float(val_loss), "best_val_accuracy": float(val_accuracy),
                            "train_seconds": train_seconds, "best_epoch": best_epoch})

        model_path = run_dir / MODEL_FILE
        tmp_path = run_dir / f".{MODEL_FILE}.tmp.keras"
        model.save(tmp_path)
        os.replace(tmp_path, model_path)
        tokenizer_dir = run_dir / "tokenizer"
        tokenizer_dir.mkdir(exist_ok=True)
        for name in (VOCABULARY_FILE, SETTINGS_FILE, LABELS_FILE):
            shutil.copy2(tokenize_dir / name, tokenizer_dir / name)
        curves = plot_training_curves(history, run_dir / "training_curves.png", run_name(config))
        mlflow.log_artifact(str(curves), "plots")
        (run_dir / "history.json").write_text(json.dumps(history, indent=2))
        model_uri = log_pyfunc_model(run_dir, ["A wonderful, moving film.", "Dull and far too long."])
        manifest = build_manifest(
            STAGE, config_hash, inputs, {k: v for k, v in config.to_dict().items() if k in ("model", "training")},
            mlflow_run_id=run_id, model_uri=model_uri, tracking_uri=mlflow.get_tracking_uri(),
            device=device, precision=policy, train_seconds=round(train_seconds, 1),
            best_val_accuracy=float(val_accuracy), best_val_loss=float(val_loss),
            epochs_run=len(history["loss"]), parameters=model.count_params(),
        )
        atomic_write_json(run_dir / "manifest.json", manifest)
    keras.mixed_precision.set_global_policy("float32")
    print(f"train: read {len(train_ids):,} train / {len(val_ids):,} val rows from {tokenize_dir}/; wrote "
          f"{run_dir}/{MODEL_FILE} and MLflow run {run_id}: val_accuracy {val_accuracy:.4f} after "
          f"{len(history['loss'])} epochs in {time.perf_counter() - started:.0f}s on {device} ({policy})")
    return run_dir


def main(config: Config, args) -> None:
    run(config, force=args.force)
