"""Training the Transformer classifier on tokenized reviews, tracked in MLflow (the work of ``make train``).

Reads:  ``data/tokenize/`` (ids, labels, vocabulary, manifest) and ``data/ingest/`` (logged as
        the run's datasets).
Writes: ``data/train/<pooling>-<position>[-pretrained]-seed<seed>-<config hash>-<tokenize hash>/`` holding
        ``model.keras``, the tokenizer files, ``history.json``, ``training_curves.png`` and ``manifest.json``
        (with the MLflow run id); the same run in MLflow with params, tags, per-epoch
        metrics, the curves, the dataset inputs and a pyfunc model scoring raw strings.

``train_model`` reads top to bottom like this: skip when up to date; choose the hardware; load the
data; build and compile the model; start (or resume) the MLflow run and log what goes in;
fit (``pipeline.model.fit``); save the outputs. A killed run resumes from its last finished epoch
(``keras.callbacks.BackupAndRestore``) and continues the same MLflow run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import keras
import mlflow
import numpy as np

from pipeline.config import Config, ModelConfig, TrainingConfig
from pipeline.core.catalog import (
    BACKBONE_WEIGHTS_FILE,
    BACKUP_DIR,
    HISTORY_FILE,
    KERAS_MODEL_FILE,
    LABELS_FILE,
    MODEL_SETTINGS_FILE,
    PSEUDO_LABELS_FILE,
    TOKEN_LENGTHS_PLOT,
    TOKENIZER_DIR,
    TOKENIZER_SETTINGS_FILE,
    VOCABULARY_FILE,
    require_output,
    stage_dir,
)
from pipeline.core.checkpoints import checkpoint_origin
from pipeline.core.files import (
    atomic_write_json,
    build_manifest,
    is_up_to_date,
    manifest_hash,
    require_manifest,
    sha256_file,
    write_manifest,
)
from pipeline.model.adversarial import classifier_of
from pipeline.model.assembly import Device, StartingWeights, assemble_classifier, uses_preset
from pipeline.model.classifiers import SentimentClassifier
from pipeline.model.fit import FitResult, TrainingData, balanced_class_weights, compile_model, fit
from pipeline.model.logged_model import log_pipeline_model
from pipeline.runtime.backend import (
    DistributionStrategy,
    check_training_settings,
    choose_jax_hardware,
    device_names,
    keras_backend,
    uses_tensorflow,
)
from pipeline.runtime.datasets import make_dataset, padding_fractions, subsample
from pipeline.runtime.hardware import choose_hardware, cluster_from_env, multi_worker_fit, worker_role
from pipeline.stages.ingest.outputs import read_split, split_path
from pipeline.stages.pretrain.outputs import check_vocabulary, load_backbone, resolve_pretrained
from pipeline.stages.pseudo_label.outputs import load_pseudo_labels, load_training_crops, training_crops_path
from pipeline.stages.pseudo_label.teacher import one_hot, with_pseudo_labels
from pipeline.stages.tokenize.outputs import load_split
from pipeline.stages.train.outputs import transformer_artifacts
from pipeline.text.conventions import PAD_ID, load_labels
from pipeline.text.preset_tokenizer import PRESET_ASSETS_DIR
from pipeline.text.text_tokenizer import load_text_tokenizer
from pipeline.tracking import (
    CHECKPOINT_ARTIFACTS,
    CHECKPOINT_LICENCE_TAG,
    CHECKPOINT_SOURCE_TAG,
    PRETRAINED_FROM_TAG,
    PSEUDO_LABELS_FROM_TAG,
    TRAIN_STAGE,
    flat_params,
    setup_tracking,
    standard_tags,
)

STAGE = TRAIN_STAGE
RUN_ID_FILE = "mlflow_run_id.txt"


# --------------------------------------------------------------------------- pure helpers


def run_name(config: Config) -> str:
    init = "-pretrained" if config.model.init == "pretrained" else ""
    pseudo = "-pseudo" if config.training.pseudo_labels else ""
    encoder = config.model.position if config.model.preset is None else "preset"  # a preset has its own positions
    return f"{config.model.pooling}-{encoder}{init}{pseudo}-seed{config.training.seed}"


def plot_training_curves(history: dict[str, list[float]], path: Path, title: str) -> Path:
    from pipeline.core.plots import new_figure, save_figure

    figure, (loss_axis, accuracy_axis) = new_figure(width=10, height=4, ncols=2)
    epochs = np.arange(1, len(history.get("loss", [])) + 1)
    for key, axis in (("loss", loss_axis), ("accuracy", accuracy_axis)):
        axis.plot(epochs, history.get(key, []), marker="o", label=f"train {key}")
        axis.plot(epochs, history.get(f"val_{key}", []), marker="o", label=f"validation {key}")
        axis.set(xlabel="epoch", ylabel=key, title=f"{title}: {key}")
        axis.legend()
    return save_figure(figure, path)


@dataclass(frozen=True)
class TrainedRun:
    """What training hands on: the MLflow run (None on a cluster's non-chief worker), its folder and config, and the
    tokenized train rows it learned from (indices; pseudo-labelled rows aside)."""

    run_id: str | None
    run_dir: Path
    config: Config
    train_rows: np.ndarray

    @classmethod
    def of(cls, run_dir: Path, config: Config, train_rows: np.ndarray) -> TrainedRun:
        return cls(require_manifest(run_dir)["mlflow_run_id"], run_dir, config, train_rows)

    def logged_run_id(self) -> str:
        """The MLflow run; an error on a cluster's non-chief worker, which logs none."""
        if self.run_id is None:
            raise ValueError(f"{self.run_dir}: trained by a cluster's non-chief worker, which has no MLflow run")
        return self.run_id


def kept_train_rows(training: TrainingConfig, train_rows: int) -> np.ndarray:
    """The indices of the tokenized train rows a run learns from: all of them, or ``training.max_train_samples``
    drawn with ``training.seed``."""
    if training.max_train_samples:
        return subsample(train_rows, training.max_train_samples, training.seed)
    return np.arange(train_rows)


@dataclass(frozen=True)
class Hardware:
    strategy: DistributionStrategy  # a tf.distribute.Strategy, or pipeline.runtime.backend.OneProgram off TensorFlow
    policy: str  # Keras dtype policy
    device: str  # what is used, for people
    devices: tuple[str, ...]  # every device TensorFlow sees


def run_directory(
    config: Config, tokenize_dir: Path, pretrained_dir: Path | None = None
) -> tuple[Path, str, dict[str, str]]:
    inputs = {"tokenize_manifest_sha256": manifest_hash(tokenize_dir)}
    if config.training.pseudo_labels:  # the labels themselves: a rerun that writes the same ones changes nothing
        inputs["pseudo_labels_sha256"] = sha256_file(require_output(config, "pseudo-label") / PSEUDO_LABELS_FILE)
        inputs["pseudo_label_targets"] = "soft" if config.pseudo_label.soft else "hard"  # the same file, read two ways
        if config.pseudo_label.crops_per_review:
            inputs["training_crops_sha256"] = sha256_file(training_crops_path(require_output(config, "pseudo-label")))
    if pretrained_dir is not None:
        load_backbone(pretrained_dir, check_only=True)  # a clear error when the folder holds no backbone
        inputs["pretrained_weights_sha256"] = sha256_file(pretrained_dir / BACKBONE_WEIGHTS_FILE)
    config_hash = config.section_hash("model", "training")
    key = f"{run_name(config)}-{config_hash[:8]}-{inputs['tokenize_manifest_sha256'][:8]}"
    if "pseudo_labels_sha256" in inputs:  # runs on different pseudo labels (or read other ways) get other folders
        key += f"-{inputs['pseudo_labels_sha256'][:8]}" + ("-soft" if config.pseudo_label.soft else "")
    if "training_crops_sha256" in inputs:
        key += f"-crops{inputs['training_crops_sha256'][:8]}"
    return stage_dir(config, STAGE) / key, config_hash, inputs


def prepare_run_directory(run_dir: Path, force: bool) -> None:
    """Start clean when forced, unless a killed run left a backup to resume from."""
    if force and not (run_dir / BACKUP_DIR).exists():
        shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def prepare_hardware(config: Config) -> Hardware:
    """Seed everything, pick the strategy and dtype policy, and say what was picked."""
    keras.utils.set_random_seed(config.training.seed)
    if uses_tensorflow():
        strategy, policy, device = choose_hardware(config.training.precision, config.model.hidden_dim)
    else:
        strategy, policy, device = choose_jax_hardware(config.training.precision)
    keras.mixed_precision.set_global_policy(policy)
    devices = device_names()
    print(f"train: Keras backend {keras_backend()}; devices {list(devices)}; using {device}, precision {policy}")
    return Hardware(strategy, policy, device, devices)


def load_training_data(
    config: Config, tokenize_dir: Path, replicas: int, shard: tuple[int, int] = (0, 1)
) -> TrainingData:
    """The tokenized train and validation splits as shuffled/batched datasets (``shard``: see ``make_dataset``)."""
    labels = load_labels(tokenize_dir)
    train_ids, train_labels = load_split(tokenize_dir, "train")
    val_ids, val_labels = load_split(tokenize_dir, "val")
    if config.training.max_train_samples:
        keep = kept_train_rows(config.training, len(train_ids))
        train_ids, train_labels = train_ids[keep], train_labels[keep]
    pseudo_rows, pseudo_run_id = 0, None
    if config.training.pseudo_labels:
        pseudo_ids, pseudo_labels, pseudo_manifest = load_pseudo_labels(
            require_output(config, "pseudo-label"), tokenize_dir, len(labels), config.pseudo_label.soft
        )
        if pseudo_labels.ndim == 2:  # soft targets: every row a probability vector, gold rows one-hot
            train_labels, val_labels = one_hot(train_labels, len(labels)), one_hot(val_labels, len(labels))
        if config.pseudo_label.crops_per_review:  # sentence crops of the train reviews, soft (or hard) targets
            texts, targets = load_training_crops(require_output(config, "pseudo-label"), len(labels))
            pseudo_ids = np.concatenate([pseudo_ids, load_text_tokenizer(tokenize_dir).encode(texts)])
            pseudo_labels = np.concatenate(
                [
                    pseudo_labels,
                    targets if pseudo_labels.ndim == 2 else targets.argmax(axis=1).astype(pseudo_labels.dtype),
                ]
            )
        train_ids = np.concatenate([np.asarray(train_ids), pseudo_ids])
        train_labels = np.concatenate([np.asarray(train_labels, dtype=pseudo_labels.dtype), pseudo_labels])
        pseudo_rows, pseudo_run_id = len(pseudo_labels), pseudo_manifest.get("mlflow_run_id")
    batch_size = config.training.batch_size * replicas
    return TrainingData(
        text_tokenizer=load_text_tokenizer(tokenize_dir),
        labels=labels,
        train_rows=len(train_ids),
        val_rows=len(val_ids),
        pseudo_label_rows=pseudo_rows,
        pseudo_label_run_id=pseudo_run_id,
        train=make_dataset(
            train_ids, train_labels, batch_size, config.training.seed, config.training.length_multiple, shard=shard
        ),
        val=make_dataset(
            val_ids, val_labels, batch_size * 4, length_multiple=config.training.length_multiple, shard=shard
        ),
        steps_per_epoch=-(-len(train_ids) // batch_size),
        class_weight=(
            balanced_class_weights(train_labels if train_labels.ndim == 1 else train_labels.argmax(axis=1), len(labels))
            if config.training.class_weights
            else None
        ),
        soft_targets=train_labels.ndim == 2,
        tokens_per_epoch=int((np.asarray(train_ids) != PAD_ID).sum()),
        padding=padding_fractions(train_ids, batch_size, config.training.seed, config.training.length_multiple),
    )


def starting_weights(
    model_config: ModelConfig, data: TrainingData, tokenize_dir: Path, pretrained_dir: Path | None
) -> tuple[StartingWeights, dict | None]:
    """What the pipeline's own encoder starts from, read from files: a pretrained backbone, its vocabulary checked;
    and that backbone's spec."""
    if uses_preset(model_config, data.text_tokenizer) or pretrained_dir is None:
        return StartingWeights(), None
    weights, spec = load_backbone(pretrained_dir)
    check_vocabulary(spec, require_manifest(tokenize_dir)["vocabulary_sha256"], str(pretrained_dir))
    return StartingWeights(backbone=weights, backbone_source=str(pretrained_dir)), spec


def build_and_compile(
    config: Config, data: TrainingData, hardware: Hardware, tokenize_dir: Path, pretrained_dir: Path | None
) -> tuple[keras.Model, dict | None]:
    """The compiled classifier (``pipeline.model.assembly``), its backbone loaded from ``pretrained_dir`` when given;
    and that backbone's spec."""
    start, spec = starting_weights(config.model, data, tokenize_dir, pretrained_dir)
    with hardware.strategy.scope():
        model, loaded = assemble_classifier(
            config.model,
            config.training,
            data.text_tokenizer,
            len(data.labels),
            Device(on_cpu="GPU" not in hardware.device, policy=hardware.policy),
            start,
        )
        if uses_preset(config.model, data.text_tokenizer):
            print(f"train: fine-tuning preset {config.model.preset} ({model.count_params():,} parameters)")
        elif spec is not None:
            print(
                f"train: started from the pretrained backbone in {pretrained_dir}/ ({len(loaded)} layers, "
                f"MLflow run {spec.get('mlflow_run_id')})"
            )
        return compile_model(
            model, config.training, config.model.starts_pretrained, data.steps_per_epoch, data.soft_targets
        ), spec


@contextlib.contextmanager
def start_or_resume_run(config: Config, run_dir: Path) -> Iterator[tuple[str, bool]]:
    """The MLflow run of ``run_dir``: the one a killed run left (with its backup), else a new one.

    Yields ``(run_id, resumed)``; nested under the active run when there is one (a comparison).
    """
    setup_tracking(config.tracking)
    run_id_path = run_dir / RUN_ID_FILE
    resume_run_id = (
        run_id_path.read_text().strip() if run_id_path.is_file() and (run_dir / BACKUP_DIR).exists() else None
    )
    with mlflow.start_run(
        run_id=resume_run_id,
        run_name=None if resume_run_id else run_name(config),
        nested=mlflow.active_run() is not None,
    ) as active:
        run_id_path.write_text(active.info.run_id)
        if resume_run_id:
            print(f"train: resuming MLflow run {resume_run_id} from {run_dir}/backup")
        yield active.info.run_id, resume_run_id is not None


def log_run_inputs(
    config: Config,
    data: TrainingData,
    hardware: Hardware,
    model: keras.Model,
    config_hash: str,
    inputs: dict[str, str],
    tokenize_dir: Path,
    pretrained: dict | None,
) -> None:
    """Params, tags, the datasets and the token-length plot of a new run (and which pretraining it started from)."""
    if pretrained is not None:
        mlflow.set_tags(
            {
                PRETRAINED_FROM_TAG: str(pretrained.get("mlflow_run_id")),
                "pretrained_steps": str(pretrained.get("steps")),
            }
        )
    if data.pseudo_label_rows:
        mlflow.set_tag(PSEUDO_LABELS_FROM_TAG, str(data.pseudo_label_run_id))
    if config.model.preset is not None:  # where the checkpoint came from, its licence and its licence files
        origin = checkpoint_origin(config.model.preset)
        mlflow.set_tags({CHECKPOINT_SOURCE_TAG: origin.source, CHECKPOINT_LICENCE_TAG: origin.licence})
        for path in origin.licence_files:
            mlflow.log_artifact(str(path), CHECKPOINT_ARTIFACTS)
    mlflow.log_params(
        {
            **flat_params(config),
            "device": hardware.device,
            "precision_policy": hardware.policy,
            "vocabulary_size": data.text_tokenizer.vocabulary_size,
            "train_rows": data.train_rows,
            "pseudo_label_rows": data.pseudo_label_rows,
            "num_classes": len(data.labels),
            "class_weight": str(data.class_weight),
            "parameters": model.count_params(),
        }
    )
    mlflow.log_metrics(data.padding)
    mlflow.set_tags(
        standard_tags(
            config.model,
            config_hash,
            STAGE,
            **SentimentClassifier.run_tags(),
            device=hardware.device,
            precision=hardware.policy,
            keras_backend=keras_backend(),
            devices=",".join(hardware.devices),
            tokenize_manifest=inputs["tokenize_manifest_sha256"][:16],
            ingest_manifest=require_manifest(tokenize_dir)["inputs"]["ingest_manifest_sha256"][:16],
        )
    )
    ingest_dir = stage_dir(config, "ingest")
    for split, context in (("train", "training"), ("val", "validation")):
        frame = read_split(ingest_dir, split, columns=["review_id", "label", "rating"])
        mlflow.log_input(
            mlflow.data.from_pandas(  # type: ignore[attr-defined]  # set on mlflow.data by its registry
                frame, source=str(split_path(ingest_dir, split)), name=f"imdb-{split}", targets="label"
            ),
            context=context,
        )
    mlflow.log_artifact(str(tokenize_dir / TOKEN_LENGTHS_PLOT), "data")


def save_outputs(
    run: TrainedRun,
    model: keras.Model,
    tokenize_dir: Path,
    result: FitResult,
    hardware: Hardware,
    config_hash: str,
    inputs: dict[str, str],
) -> dict:
    """``model.keras``, the tokenizer copy, history and curves, the pyfunc model, then the manifest last, into
    ``run``'s folder and MLflow run."""
    config, run_dir = run.config, run.run_dir
    model_path = run_dir / KERAS_MODEL_FILE
    tmp_path = run_dir / f".{KERAS_MODEL_FILE}.tmp.keras"
    # The graph and weights only, through an uncompiled model of the same layers: a compiled model's file also holds
    # the optimizer's state (AdamW's two moments, twice the weights: 3x the file with a 2^18-row n-gram table),
    # which no scorer reads; a killed run resumes from BackupAndRestore's checkpoint, not from this file.
    classifier = classifier_of(model)  # an adversarial wrapper is for fitting only
    keras.Model(classifier.inputs, classifier.outputs, name=classifier.name).save(tmp_path)
    os.replace(tmp_path, model_path)
    tokenizer_dir = run_dir / TOKENIZER_DIR
    tokenizer_dir.mkdir(exist_ok=True)
    for name in (VOCABULARY_FILE, TOKENIZER_SETTINGS_FILE, LABELS_FILE):
        shutil.copy2(tokenize_dir / name, tokenizer_dir / name)
    atomic_write_json(run_dir / MODEL_SETTINGS_FILE, {"long_reviews": config.model.long_reviews})  # travels with it
    if (tokenize_dir / PRESET_ASSETS_DIR).is_dir():  # a preset's tokenizer files: the model needs no preset later
        shutil.copytree(tokenize_dir / PRESET_ASSETS_DIR, tokenizer_dir / PRESET_ASSETS_DIR, dirs_exist_ok=True)
    curves = plot_training_curves(result.history, run_dir / "training_curves.png", run_name(config))
    mlflow.log_artifact(str(curves), "plots")
    atomic_write_json(run_dir / HISTORY_FILE, result.history)
    model_uri = log_pipeline_model(SentimentClassifier(), transformer_artifacts(run_dir))
    manifest = build_manifest(
        STAGE,
        config_hash,
        inputs,
        {k: v for k, v in config.to_dict().items() if k in ("model", "training")},
        mlflow_run_id=run.run_id,
        model_uri=model_uri,
        tracking_uri=mlflow.get_tracking_uri(),
        device=hardware.device,
        precision=hardware.policy,
        train_seconds=round(result.train_seconds, 1),
        best_val_accuracy=result.val_accuracy,
        best_val_loss=result.val_loss,
        epochs_run=len(result.history["loss"]),
        parameters=model.count_params(),
    )
    write_manifest(run_dir, manifest)
    return manifest


# --------------------------------------------------------------------------- stage entry point


def train_model(
    config: Config, force: bool = False, extra_callbacks: Sequence[keras.callbacks.Callback] = ()
) -> TrainedRun:
    """Train one model; returns its run. Skips when an identical finished run exists. With ``training.pseudo_labels``
    the pseudo labels are made first (``pipeline.stages.pseudo_label.teacher.with_pseudo_labels``); the run's config
    is then the one it trained with."""
    started = time.perf_counter()
    check_training_settings(config.training.adversarial_epsilon)
    tokenize_dir = require_output(config, "tokenize")
    require_output(config, "ingest")  # its splits are logged as the run's datasets
    cluster = cluster_from_env()
    config = with_pseudo_labels(config, make=cluster is None)  # a cluster's workers read them, made before
    pretrained_dir = resolve_pretrained(config) if config.model.init == "pretrained" else None
    run_dir, config_hash, inputs = run_directory(config, tokenize_dir, pretrained_dir)
    train_rows = kept_train_rows(config.training, len(load_split(tokenize_dir, "train")[1]))
    if cluster is None and not force and is_up_to_date(run_dir, config_hash, inputs, [KERAS_MODEL_FILE]):
        print(f"train: up to date, nothing to do ({run_dir}/, MLflow run {require_manifest(run_dir)['mlflow_run_id']})")
        return TrainedRun.of(run_dir, config, train_rows)
    with worker_role(cluster, STAGE) as role:  # in a cluster nobody skips: every step needs every worker
        scratch = role.scratch
        if scratch is None:
            prepare_run_directory(run_dir, force or cluster is not None)
        hardware = prepare_hardware(config)
        data = load_training_data(config, tokenize_dir, hardware.strategy.num_replicas_in_sync, role.shard)
        model, pretrained = build_and_compile(config, data, hardware, tokenize_dir, pretrained_dir)
        if scratch is not None:
            with multi_worker_fit(model, data.train, hardware.strategy):
                result = fit(model, data, config.training, scratch, None, extra_callbacks)
            print(
                f"train: {hardware.device}: trained {len(result.history['loss'])} epochs with the chief; "
                f"its run folder and MLflow run hold the result (scratch {scratch}/ removed)"
            )
            return TrainedRun(None, run_dir, config, train_rows)
        with start_or_resume_run(config, run_dir) as (run_id, resumed):
            if not resumed:
                log_run_inputs(config, data, hardware, model, config_hash, inputs, tokenize_dir, pretrained)
            with multi_worker_fit(model, data.train, hardware.strategy):
                result = fit(model, data, config.training, run_dir, run_id, extra_callbacks)
            save_outputs(
                TrainedRun(run_id, run_dir, config, train_rows),
                model,
                tokenize_dir,
                result,
                hardware,
                config_hash,
                inputs,
            )
    pseudo = f" (of which {data.pseudo_label_rows:,} pseudo-labelled)" if data.pseudo_label_rows else ""
    print(
        f"train: read {data.train_rows:,} train{pseudo} / {data.val_rows:,} val rows from {tokenize_dir}/; wrote "
        f"{run_dir}/{KERAS_MODEL_FILE} and MLflow run {run_id}: val_accuracy {result.val_accuracy:.4f} after "
        f"{len(result.history['loss'])} epochs in {time.perf_counter() - started:.0f}s on {hardware.device} "
        f"({hardware.policy})"
    )
    return TrainedRun(run_id, run_dir, config, train_rows)
