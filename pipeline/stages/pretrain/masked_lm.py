"""The work of ``make pretrain``: masked-language modelling of the encoder on the train split and unlabeled reviews.

Reads:  ``data/tokenize/`` (``train_ids.npy``, ``unlabeled_ids.npy`` when ingestion found unlabeled
        reviews, the vocabulary). Validation and test texts are never used.
Writes: ``data/pretrain/`` holding ``backbone.weights.npz`` (the encoder's weights by layer name),
        ``backbone.json`` (its shape, vocabulary checksum and MLflow run), ``history.json``,
        ``loss_curve.png`` and ``manifest.json``; an MLflow run with the masked-LM loss and
        masked-token accuracy every ``pretrain.log_every_steps`` steps, throughput, and the backbone
        files as artifacts under ``backbone/`` (so ``runs:/<run_id>/backbone`` can be fine-tuned from).

BERT-style masking with KerasHub's ``MaskedLMMaskGenerator`` (15 % of real tokens selected; of
those 80 % become ``[MASK]``, 10 % a random token, 10 % stay) and ``MaskedLMHead`` tied to the
token embedding (``pipeline.model.transformer.build_masked_lm``). The same function builds the backbone of
the classifier, so ``make train`` with ``model.init: pretrained`` starts from these weights.

Budgeted and resumable: training stops after ``pretrain.max_minutes`` of training time or
``pretrain.max_steps`` steps, whichever comes first; a checkpoint is written every
``log_every_steps`` steps, and a killed run resumes from it (same MLflow run, time already spent
counted). A finished pretraining with the same inputs and config is not repeated.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import keras
import numpy as np

from pipeline.config import Config, ModelConfig, PretrainConfig
from pipeline.core.catalog import (
    BACKBONE_SNAPSHOTS_DIR,
    BACKBONE_SPEC_FILE,
    BACKBONE_WEIGHTS_FILE,
    BACKUP_DIR,
    HISTORY_FILE,
    UNLABELED_IDS_FILE,
    ids_file,
    require_output,
    stage_dir,
)
from pipeline.core.errors import ConfigError, InputError
from pipeline.core.files import (
    atomic_write_json,
    build_manifest,
    is_up_to_date,
    manifest_hash,
    require_manifest,
    sha256_text,
    write_manifest,
)
from pipeline.model.fit import build_optimizer
from pipeline.runtime.backend import require_tensorflow
from pipeline.runtime.hardware import any_worker, choose_hardware, cluster_from_env, multi_worker_fit, worker_role
from pipeline.stages.pretrain.masking import masked_lm_dataset
from pipeline.stages.pretrain.outputs import save_backbone
from pipeline.text.conventions import PAD_ID
from pipeline.text.wordpiece import WordPieceTextTokenizer

if TYPE_CHECKING:
    import tensorflow as tf

STAGE = "pretrain"
CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.json"

# --------------------------------------------------------------------------- stage steps


def pretraining_ids(tokenize_dir: Path, max_texts: int | None) -> tuple[np.ndarray, dict[str, int]]:
    """Token ids of the train split plus the unlabeled reviews (never validation or test)."""
    parts = {"train": np.load(tokenize_dir / ids_file("train"))}
    if (tokenize_dir / UNLABELED_IDS_FILE).is_file():
        parts["unlabeled"] = np.load(tokenize_dir / UNLABELED_IDS_FILE)
    else:
        print(
            "pretrain: warning: no unlabeled reviews were ingested (set IMDB_UNSUP_ARCHIVE or "
            "data.unlabeled_archive and rerun `make ingest tokenize`); pretraining on the train split only"
        )
    ids = np.concatenate(list(parts.values()))
    if max_texts:
        ids = ids[np.random.default_rng(0).permutation(len(ids))[:max_texts]]
    return ids, {name: len(part) for name, part in parts.items()}


def learning_rate_schedule(settings: PretrainConfig):
    """Linear warm-up, then cosine decay to zero over ``max_steps`` or, with a time budget only, constant."""
    if settings.max_steps:
        warmup = min(settings.warmup_steps, settings.max_steps - 1)
        return keras.optimizers.schedules.CosineDecay(
            0.0 if warmup else settings.learning_rate,
            decay_steps=max(1, settings.max_steps - warmup),
            warmup_target=settings.learning_rate if warmup else None,
            warmup_steps=warmup,
        )
    return WarmupThenConstant(settings.learning_rate, settings.warmup_steps)


@keras.saving.register_keras_serializable(package="pipeline")
class WarmupThenConstant(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``peak`` over ``warmup_steps``, then constant (for a budget in minutes)."""

    def __init__(self, peak: float, warmup_steps: int):
        self.peak, self.warmup_steps = float(peak), int(warmup_steps)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        return self.peak * keras.ops.minimum(1.0, (step + 1.0) / max(1, self.warmup_steps))

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


def budget_callbacks(
    settings: PretrainConfig,
    state_path: Path,
    tokens_per_step: float,
    snapshot: Callable[[str], None],
    log_metrics: Callable[[dict, int], object],  # what it returns is ignored
    any_worker: Callable[[bool], bool] | None = None,
):
    """Stop at the step or time budget (time already spent before a kill counts); ``log_metrics`` per period;
    call ``snapshot(name)`` the first period end after each of ``pretrain.snapshot_minutes``.

    ``any_worker`` (in a cluster): the time budget and the snapshot times are checked at period
    ends only, and ``any_worker(flag)`` turns each worker's own clock into one decision, so every
    worker stops, and snapshots, at the same step. The step budget needs no agreement.
    """

    class Budget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            state = json.loads(state_path.read_text()) if state_path.is_file() else {}
            self.spent = float(state.get("train_seconds", 0.0))
            self.steps = int(state.get("steps", 0))
            self.history: dict[str, list] = state.get("history", {"step": [], "loss": [], "accuracy": []})
            self.snapshots: list[str] = state.get("snapshots", [])

        def on_train_begin(self, logs=None):
            self.started = time.perf_counter()
            self.period_started, self.period_steps = self.started, 0

        def seconds(self) -> float:
            return self.spent + time.perf_counter() - self.started

        def over_time(self) -> bool:
            return settings.max_minutes is not None and self.seconds() >= 60 * settings.max_minutes

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            self.period_steps += 1
            over_steps = settings.max_steps is not None and self.steps >= settings.max_steps
            if over_steps or (any_worker is None and self.over_time()):
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            now = time.perf_counter()
            rate = self.period_steps * tokens_per_step / max(now - self.period_started, 1e-9)
            metrics = {
                "mlm_loss": float(logs["loss"]),
                "mlm_accuracy": float(logs["accuracy"]),
                "tokens_per_second": rate,
                "train_minutes": self.seconds() / 60,
            }
            log_metrics(metrics, self.steps)
            for key, value in (
                ("step", self.steps),
                ("loss", metrics["mlm_loss"]),
                ("accuracy", metrics["mlm_accuracy"]),
            ):
                self.history[key].append(value)
            agree = any_worker or bool
            for minutes in settings.snapshot_minutes or ():
                if settings.max_minutes is not None and minutes >= settings.max_minutes:
                    continue  # the final backbone is that point
                name = f"{minutes:g}min"
                if name not in self.snapshots and agree(self.seconds() >= 60 * minutes):
                    snapshot(name)
                    self.snapshots.append(name)
            if any_worker is not None and any_worker(self.over_time()):
                self.model.stop_training = True
            atomic_write_json(
                state_path,
                {
                    **json.loads(state_path.read_text()),
                    "train_seconds": self.seconds(),
                    "steps": self.steps,
                    "history": self.history,
                    "snapshots": self.snapshots,
                },
            )
            self.period_started, self.period_steps = now, 0

    return Budget()


def plot_loss_curve(history: dict, path: Path) -> Path:
    from pipeline.core.plots import new_figure, save_figure

    figure, (loss_axis, accuracy_axis) = new_figure(width=10, height=4, ncols=2)
    loss_axis.plot(history["step"], history["loss"], marker=".")
    loss_axis.set(xlabel="step", ylabel="masked-LM loss", title="Pretraining loss")
    accuracy_axis.plot(history["step"], history["accuracy"], marker=".", color="tab:green")
    accuracy_axis.set(xlabel="step", ylabel="masked-token accuracy", title="Masked-token accuracy")
    return save_figure(figure, path)


@dataclass(frozen=True)
class StageFiles:
    """Where pretraining reads and writes, and what its result is keyed on (the tokenization, the config)."""

    tokenize_dir: Path
    out_dir: Path
    inputs: dict[str, str]
    config_hash: str


@dataclass(frozen=True)
class Checkpoint:
    """This process's checkpoint folder, the state a killed run left in it, and whether this run resumes it."""

    folder: Path
    state: dict
    resuming: bool
    steps_done: int  # 0 unless resuming

    @property
    def state_path(self) -> Path:
        return self.folder / STATE_FILE


@dataclass(frozen=True)
class MaskedLMTraining:
    """A compiled masked LM with its batches and hardware, ready to train within the budget."""

    config: Config
    model: keras.Model
    dataset: tf.data.Dataset
    strategy: tf.distribute.Strategy
    checkpoint: Checkpoint
    tokens_per_step: float
    agree: Callable[[bool], bool] | None  # in a cluster: one decision from every worker's own clock
    extra_callbacks: Sequence
    device: str
    policy: str

    def budget(self, snapshot: Callable[[str], None], log_metrics: Callable[[dict, int], object]):
        """The budget callback (:func:`budget_callbacks`), continuing the checkpoint's state."""
        return budget_callbacks(
            self.config.pretrain, self.checkpoint.state_path, self.tokens_per_step, snapshot, log_metrics, self.agree
        )

    def fit(self, budget) -> None:
        """Train until ``budget`` stops it; a single process backs up every period, so a killed run resumes."""
        settings = self.config.pretrain
        epochs = math.ceil(settings.max_steps / settings.log_every_steps) if settings.max_steps else 10**6
        backups = str(self.checkpoint.folder / BACKUP_DIR)
        callbacks = [keras.callbacks.BackupAndRestore(backups, delete_checkpoint=False)] if self.agree is None else []
        with multi_worker_fit(self.model, self.dataset, self.strategy):
            self.model.fit(
                self.dataset,
                epochs=epochs,
                steps_per_epoch=settings.log_every_steps,
                verbose=2,
                callbacks=[*callbacks, budget, *self.extra_callbacks],
            )


def maskable_tokenizer(tokenize_dir: Path) -> WordPieceTextTokenizer:
    """The tokenize stage's tokenizer, refused when its vocabulary has no ``[MASK]`` token to pretrain with."""
    text_tokenizer = WordPieceTextTokenizer.load(tokenize_dir)
    if not text_tokenizer.can_mask:
        raise InputError(
            f"{tokenize_dir}: the vocabulary has no [MASK] token (learned before pretraining existed): "
            "rerun `make tokenize FORCE=1`"
        )
    return text_tokenizer


def open_checkpoint(files: StageFiles, scratch: Path | None, resumable: bool) -> Checkpoint:
    """This process's checkpoint: resumed when ``resumable`` and a killed run with the same inputs and config left
    one; otherwise a fresh one, the stage folder emptied first (a cluster worker's ``scratch`` folder is new)."""
    folder = (files.out_dir if scratch is None else scratch) / CHECKPOINT_DIR
    state_path = folder / STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    resuming = (
        resumable
        and state.get("config_hash") == files.config_hash
        and state.get("inputs") == files.inputs
        and (folder / BACKUP_DIR).is_dir()
    )
    if not resuming and scratch is None:
        shutil.rmtree(files.out_dir, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return Checkpoint(folder, state, resuming, int(state.get("steps", 0)) if resuming else 0)


def compile_masked_lm(
    config: Config, tokenizer: WordPieceTextTokenizer, strategy: tf.distribute.Strategy
) -> keras.Model:
    """The masked LM, compiled under ``strategy`` with AdamW on :func:`learning_rate_schedule`, optimizer built."""
    from pipeline.model.transformer import build_masked_lm

    with strategy.scope():
        model = build_masked_lm(config.model, tokenizer.vocabulary_size, tokenizer.settings.max_sequence_length)
        model.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate_schedule(config.pretrain), weight_decay=config.pretrain.weight_decay, clipnorm=1.0
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
    build_optimizer(model)
    return model


# --------------------------------------------------------------------------- stage entry point


def pretrain(config: Config, force: bool = False, extra_callbacks: Sequence = ()) -> Path:
    """Pretrain the encoder within the budget; returns ``data/pretrain``.

    In a cluster (``TF_CONFIG`` naming several workers) every worker pretrains under
    ``MultiWorkerMirroredStrategy`` on its share of each global batch; the chief alone writes the
    stage folder and the MLflow run, the others work in a scratch folder removed at the end. A
    cluster's pretraining is not resumed after a kill (each worker would have to restore the same
    step from a shared checkpoint); it starts again.
    """
    started = time.perf_counter()
    if config.model.preset is not None:
        raise ConfigError(
            f"make pretrain pretrains the pipeline's own encoder; model.preset ({config.model.preset}) "
            "already names a pretrained one: fine-tune it with make train or make compare"
        )
    cluster = cluster_from_env()  # a malformed TF_CONFIG stops here, before anything is removed or written
    tokenize_dir, out_dir = require_output(config, "tokenize"), stage_dir(config, STAGE)
    files = StageFiles(
        tokenize_dir,
        out_dir,
        {"tokenize_manifest_sha256": manifest_hash(tokenize_dir)},
        f"{config.section_hash('pretrain')}-{_backbone_hash(config.model)}",
    )
    if (
        cluster is None
        and not force
        and is_up_to_date(out_dir, files.config_hash, files.inputs, [BACKBONE_WEIGHTS_FILE, BACKBONE_SPEC_FILE])
    ):
        print(
            f"pretrain: up to date, nothing to do ({out_dir}/, MLflow run {require_manifest(out_dir)['mlflow_run_id']})"
        )
        return out_dir
    require_tensorflow("masked-LM pretraining", "pretrain on the default backend (its backbone trains on any backend)")
    # the strategy first: a cluster's collective ops must be set up before TensorFlow starts
    strategy, policy, device = choose_hardware(config.pretrain.precision, config.model.hidden_dim)
    text_tokenizer = maskable_tokenizer(tokenize_dir)
    ids, rows = pretraining_ids(tokenize_dir, config.pretrain.max_texts)  # read before a scratch folder exists
    with worker_role(cluster, STAGE) as role:
        scratch = role.scratch
        checkpoint = open_checkpoint(files, scratch, resumable=cluster is None and not force)
        settings = config.pretrain
        keras.utils.set_random_seed(settings.seed + checkpoint.steps_done)  # a resumed run draws new masks
        keras.mixed_precision.set_global_policy(policy)
        batch = settings.batch_size * strategy.num_replicas_in_sync  # the global batch
        tokens_per_step = float((ids != PAD_ID).sum()) / len(ids) * batch
        model = compile_masked_lm(config, text_tokenizer, strategy)
        dataset = masked_lm_dataset(
            ids,
            batch,
            text_tokenizer.vocabulary_size,
            settings.seed + checkpoint.steps_done,
            settings.mask_rate,
            role.shard,
        )  # a new order on resume
        agree = None if cluster is None else functools.partial(any_worker, strategy)
        training = MaskedLMTraining(
            config, model, dataset, strategy, checkpoint, tokens_per_step, agree, extra_callbacks, device, policy
        )
        if scratch is not None:
            atomic_write_json(checkpoint.state_path, {})
            budget = training.budget(lambda name: None, lambda metrics, step: None)
            training.fit(budget)
            print(
                f"pretrain: {device}: {budget.steps:,} steps with the chief; its {out_dir}/ and MLflow run hold the "
                f"result (scratch {scratch}/ removed)"
            )
            return out_dir
        active, budget, history = pretrain_and_save(training, text_tokenizer, files, rows, len(ids))
    shutil.rmtree(checkpoint.folder, ignore_errors=True)
    last = (
        f"loss {history['loss'][-1]:.3f}, masked-token accuracy {history['accuracy'][-1]:.3f}"
        if history["loss"]
        else "no period finished"
    )
    print(
        f"pretrain: read {len(ids):,} reviews ({', '.join(f'{k} {v:,}' for k, v in rows.items())}) from "
        f"{tokenize_dir}/; {budget.steps:,} steps in {budget.seconds() / 60:.1f} min of training on {device} ({last}); "
        f"wrote {out_dir}/{BACKBONE_WEIGHTS_FILE} and MLflow run {active.info.run_id} "
        f"in {time.perf_counter() - started:.0f}s"
    )
    return out_dir


def pretrain_and_save(
    training: MaskedLMTraining,
    text_tokenizer: WordPieceTextTokenizer,
    files: StageFiles,
    rows: dict[str, int],
    total_rows: int,
):
    """The chief's (or single process's) part: the MLflow run, checkpoints, snapshots and the stage folder."""
    import mlflow

    from pipeline.model.transformer import backbone_weights
    from pipeline.tracking import flat_params, setup_tracking, standard_tags

    config, model, checkpoint, tokenize_dir = training.config, training.model, training.checkpoint, files.tokenize_dir
    out_dir, config_hash, device, policy = files.out_dir, files.config_hash, training.device, training.policy
    setup_tracking(config.tracking)
    run_id = checkpoint.state["mlflow_run_id"] if checkpoint.resuming else None
    with mlflow.start_run(
        run_id=run_id, run_name=None if run_id else "pretrain-mlm", nested=mlflow.active_run() is not None
    ) as active:
        if run_id:
            print(f"pretrain: resuming MLflow run {run_id} from {checkpoint.folder}/")
        else:
            atomic_write_json(
                checkpoint.state_path,
                {"config_hash": config_hash, "inputs": files.inputs, "mlflow_run_id": active.info.run_id},
            )
            mlflow.log_params(
                {
                    **flat_params(config),
                    "device": device,
                    "precision_policy": policy,
                    "pretrain_rows": total_rows,
                    **{f"rows_{k}": v for k, v in rows.items()},
                    "parameters": model.count_params(),
                }
            )
            mlflow.set_tags(standard_tags(config.model, config_hash, STAGE, device=device, precision=policy))

        def snapshot(name: str) -> None:
            folder = out_dir / BACKBONE_SNAPSHOTS_DIR / name
            folder.mkdir(parents=True, exist_ok=True)
            save_backbone(
                folder,
                backbone_weights(model),
                {
                    **spec_of(config.model, text_tokenizer, tokenize_dir, active.info.run_id),
                    "snapshot": name,
                    "steps": budget.steps,
                    "train_minutes": round(budget.seconds() / 60, 2),
                },
            )

        budget = training.budget(snapshot, lambda metrics, step: mlflow.log_metrics(metrics, step=step))
        training.fit(budget)
        history = json.loads(checkpoint.state_path.read_text())["history"]
        spec = {
            **spec_of(config.model, text_tokenizer, tokenize_dir, active.info.run_id),
            "steps": budget.steps,
            "train_minutes": round(budget.seconds() / 60, 2),
        }
        save_backbone(out_dir, backbone_weights(model), spec)
        atomic_write_json(out_dir / HISTORY_FILE, history)
        curve = plot_loss_curve(history, out_dir / "loss_curve.png")
        for path in (out_dir / BACKBONE_WEIGHTS_FILE, out_dir / BACKBONE_SPEC_FILE, curve):
            mlflow.log_artifact(str(path), "backbone")
        mlflow.log_metrics(
            {
                "final_mlm_loss": history["loss"][-1] if history["loss"] else float("nan"),
                "pretrain_steps": budget.steps,
                "pretrain_minutes": budget.seconds() / 60,
            }
        )
        write_manifest(
            out_dir,
            build_manifest(
                STAGE,
                config_hash,
                files.inputs,
                {"model": config.model.backbone(), "pretrain": config.to_dict()["pretrain"]},
                mlflow_run_id=active.info.run_id,
                rows=rows,
                steps=budget.steps,
                train_minutes=round(budget.seconds() / 60, 2),
                device=device,
                precision=policy,
            ),
        )
    return active, budget, history


def spec_of(model_config: ModelConfig, text_tokenizer, tokenize_dir: Path, run_id: str) -> dict:
    """What a saved backbone is: its shape, the vocabulary it was trained on and its MLflow run."""
    return {
        "model": model_config.backbone(),
        "vocabulary_size": text_tokenizer.vocabulary_size,
        "vocabulary_sha256": require_manifest(tokenize_dir)["vocabulary_sha256"],
        "max_sequence_length": text_tokenizer.settings.max_sequence_length,
        "mlflow_run_id": run_id,
    }


def _backbone_hash(model_config: ModelConfig) -> str:
    return sha256_text(json.dumps(model_config.backbone(), sort_keys=True))[:16]
