"""The work of ``make pseudo-label``: self-training data for the classifier from the unlabeled reviews.

Reads:  ``data/ingest/`` (``train.parquet``, ``val.parquet``, ``unlabeled.parquet``, manifest).
        Test texts are never read.
Writes: ``data/pseudo_label/`` holding ``training_crops.parquet`` with ``pseudo_label.crops_per_review`` (sentence
        crops of the train reviews and their soft targets, :func:`training_crops`), ``pseudo_labels.parquet``
        (``row``: the review's row in
        ``unlabeled.parquet`` and so in ``data/tokenize/unlabeled_ids.npy``;
        ``label``: the class index; ``confidence``: the teacher's probability of it;
        ``probability_<index>``: its probability of every class, the soft targets) for the
        reviews the teacher is at least ``pseudo_label.min_confidence`` sure of,
        ``teacher_confidence.png`` and ``manifest.json``; one MLflow run with the teacher's
        validation accuracy, how many reviews were kept and the plot.

The teacher is the comparison's NBSVM baseline, on reviews alone (``nbsvm.crops_per_review`` aside;
``pseudo_label.teacher: nbsvm``; ``tfidf`` for the TF-IDF + logistic regression one), fitted on the train split
only, or a model this pipeline logged, named by its URI (``models:/imdb-sentiment@champion``: the candidate validation
chose, a fusion included; a run's ``runs:/RUN_ID/model``; a folder), loaded as it is; its identity (MLflow's model UUID)
is one of the stage's inputs, so moving the alias makes new labels. With ``training.pseudo_labels: true``
the classifier trains on the train split plus these reviews, on the teacher's probabilities with
``pseudo_label.soft`` (distillation) or its labels without, and is still chosen on the untouched
validation split.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from pipeline.config import PSEUDO_LABEL_TEACHERS, Config, NbsvmConfig, PseudoLabelConfig
from pipeline.core.catalog import (
    PSEUDO_CROPS_FILE,
    PSEUDO_LABELS_FILE,
    require_output,
    stage_dir,
    teacher_probability_column,
)
from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.files import (
    build_manifest,
    is_up_to_date,
    manifest_hash,
    staged_directory,
    write_manifest,
)
from pipeline.lexical import class_probabilities, nbsvm_baseline, tfidf_baseline
from pipeline.model.classifiers import PipelineModel, load_classifier
from pipeline.stages.ingest.outputs import read_split, read_unlabeled, unlabeled_path
from pipeline.text.conventions import load_labels, text_problem
from pipeline.text.crops import sentence_crops
from pipeline.tracking import PSEUDO_LABEL_STAGE, STAGE_TAG, flat_params, setup_tracking

STAGE = "pseudo_label"
PLOT_FILE = "teacher_confidence.png"
TEACHER_CHUNK = 2048  # reviews a logged teacher scores at a time (one progress step)


# --------------------------------------------------------------------------- pure helpers


def fit_teacher(settings: PseudoLabelConfig, nbsvm: NbsvmConfig, train: pd.DataFrame, val: pd.DataFrame):
    """The teacher, fitted on the train split only: NBSVM (its C chosen on validation) or TF-IDF."""
    if settings.teacher == "nbsvm":
        # on the reviews alone (nbsvm.crops_per_review aside): its labels are for reviews
        return nbsvm_baseline(train, val, nbsvm.c_values, nbsvm.ngram_max, nbsvm.max_features, nbsvm.seed).model
    return tfidf_baseline(train, seed=settings.seed)


def model_probabilities(classifier: PipelineModel, texts: Sequence[str], desc: str = "teacher") -> np.ndarray:
    """A logged model's ``[N, k]`` probabilities for ``texts``, scored in chunks with a progress bar; a row it
    cannot score (``pipeline.text.conventions.text_problem``) gets NaN, which no confidence threshold keeps."""
    probabilities = np.full((len(texts), len(classifier.labels)), np.nan, dtype=np.float32)
    scorable = np.flatnonzero([not text_problem(text) for text in texts])
    with tqdm(total=len(scorable), desc=desc, unit=" reviews", mininterval=1.0) as bar:
        for start in range(0, len(scorable), TEACHER_CHUNK):
            rows = scorable[start : start + TEACHER_CHUNK]
            probabilities[rows] = classifier.probabilities([texts[r] for r in rows])
            bar.update(len(rows))
    return probabilities


def load_teacher(
    settings: PseudoLabelConfig, nbsvm: NbsvmConfig, train: pd.DataFrame, val: pd.DataFrame, names: list[str]
) -> Callable[[Sequence[str], str], np.ndarray]:
    """The teacher as ``(texts, description) -> [N, k]`` probabilities: NBSVM or TF-IDF fitted on the train split
    (:func:`fit_teacher`), or the logged model ``pseudo_label.teacher`` names, refused when its classes are not
    the ingested ones."""
    teacher = settings.teacher
    if teacher in PSEUDO_LABEL_TEACHERS:
        model = fit_teacher(settings, nbsvm, train, val)
        return lambda texts, _desc: class_probabilities(model, texts, len(names))
    classifier = load_classifier(teacher)
    if list(classifier.labels) != list(names):
        raise InputError(
            f"pseudo_label.teacher {teacher!r} predicts the classes {list(classifier.labels)}; the "
            f"ingested reviews have {list(names)}"
        )
    return lambda texts, desc: model_probabilities(classifier, list(texts), desc)


def teacher_identity(teacher: str) -> str:
    """What the labels of a logged teacher depend on besides the config: its model UUID (a moved alias or a
    re-logged folder is another model)."""
    try:
        model_uuid = mlflow.models.Model.load(teacher).model_uuid
    except (mlflow.exceptions.MlflowException, OSError) as exc:  # no such model, alias, run or folder
        raise InputError(f"pseudo_label.teacher: cannot read model {teacher!r}: {exc}") from None
    if model_uuid is None:  # an MLmodel file without one: nothing would tell a re-logged model from this one
        raise InputError(f"pseudo_label.teacher: model {teacher!r} records no model_uuid to identify it by")
    return model_uuid


def select_confident(probabilities: np.ndarray, min_confidence: float) -> pd.DataFrame:
    """Rows whose top-class probability is at least ``min_confidence``: ``row``, ``label``, ``confidence``
    (a row of NaN, one the teacher could not score, is never kept)."""
    probabilities = np.asarray(probabilities)
    confidence = probabilities.max(axis=1)
    rows = np.flatnonzero(confidence >= min_confidence)
    return pd.DataFrame(
        {
            "row": rows.astype(np.int64),
            "label": probabilities[rows].argmax(axis=1).astype(np.int32),
            "confidence": confidence[rows].astype(np.float32),
        }
    )


def sample_rows(kept: pd.DataFrame, max_rows: int | None, seed: int) -> pd.DataFrame:
    """At most ``max_rows`` of ``kept``, drawn at random with ``seed`` and left in their row order."""
    if max_rows is None or len(kept) <= max_rows:
        return kept
    chosen = np.sort(np.random.default_rng(seed).choice(len(kept), size=max_rows, replace=False))
    return kept.iloc[chosen].reset_index(drop=True)


def confident_rows(probabilities: np.ndarray, num_classes: int, settings: PseudoLabelConfig) -> pd.DataFrame:
    """The pseudo labels: the rows the teacher is sure enough of (:func:`select_confident`, at most
    ``max_rows`` of them, :func:`sample_rows`) with its probability of every class, the soft targets."""
    kept = sample_rows(select_confident(probabilities, settings.min_confidence), settings.max_rows, settings.seed)
    for index in range(num_classes):  # the teacher's probabilities: soft targets for distillation
        kept[teacher_probability_column(index)] = probabilities[kept["row"].to_numpy(), index].astype(np.float32)
    return kept


def training_crops(
    train: pd.DataFrame, settings: PseudoLabelConfig, nbsvm: NbsvmConfig, num_classes: int
) -> pd.DataFrame:
    """``pseudo_label.crops_per_review`` random 1-2-sentence crops of every train review (seeded by
    ``pseudo_label.seed``) with soft targets: ``crop_label_weight`` on the review's label plus the rest times a
    cross-fitted NBSVM's probabilities (a model that never read the crop's review). Columns ``text``, ``review`` and
    one teacher-probability column per class, as the pseudo labels'."""
    from pipeline.lexical import crop_teacher, mixed_targets

    print(
        f"pseudo-label: {settings.crops_per_review} sentence crop(s) of each of the {len(train):,} train reviews, "
        "soft targets from their review's label and a cross-fitted NBSVM"
    )
    crops = sentence_crops(train, settings.seed, settings.crops_per_review)
    teacher = crop_teacher(
        train, crops, nbsvm.c_values, nbsvm.ngram_max, nbsvm.max_features, settings.seed, num_classes
    )
    targets = mixed_targets(crops["label"].to_numpy(), teacher, settings.crop_label_weight)
    frame = crops[["text", "review"]].copy()
    for index in range(num_classes):
        frame[teacher_probability_column(index)] = targets[:, index].astype(np.float32)
    return frame


def labelling_metrics(val_accuracy: float, kept: pd.DataFrame, unlabeled_rows: int) -> dict[str, float]:
    """What the stage's MLflow run and manifest record about the labels kept."""
    return {
        "teacher_val_accuracy": val_accuracy,
        "pseudo_label_rows": len(kept),
        "pseudo_label_fraction": len(kept) / max(1, unlabeled_rows),
        "pseudo_label_mean_confidence": float(kept["confidence"].mean()) if len(kept) else 0.0,
    }


def plot_confidence(confidence: np.ndarray, min_confidence: float, title: str, path: Path) -> Path:
    from pipeline.core.plots import new_figure, save_figure

    figure, axis = new_figure()
    axis.hist(confidence, bins=50, range=(confidence.min(initial=0.5), 1.0), color="tab:blue")
    axis.axvline(min_confidence, color="tab:red", linestyle="--", label=f"kept from {min_confidence:g}")
    axis.set(xlabel="teacher's probability of its label", ylabel="unlabeled reviews", title=title)
    axis.legend()
    return save_figure(figure, path)


# --------------------------------------------------------------------------- stage entry point


def stage_identity(config: Config, ingest_dir: Path, logged: bool) -> tuple[dict[str, str], str]:
    """``(inputs, config hash)``: what the pseudo labels depend on, the ingestion and a ``logged`` teacher's model
    UUID besides the config (``nbsvm`` too for an NBSVM teacher)."""
    inputs = {"ingest_manifest_sha256": manifest_hash(ingest_dir)}
    teacher = config.pseudo_label.teacher
    if logged:
        setup_tracking(config.tracking)  # a models:/ or runs:/ teacher is read from the tracking store
        inputs["teacher_model_uuid"] = teacher_identity(teacher)
    crops_teacher = config.pseudo_label.crops_per_review > 0  # the crops' teacher is NBSVM, whatever labels the rest
    return inputs, config.section_hash("pseudo_label", *(("nbsvm",) if teacher == "nbsvm" or crops_teacher else ()))


def pseudo_label(config: Config, force: bool = False) -> Path:
    """Label the unlabeled reviews with the teacher and keep the confident ones; returns ``data/pseudo_label``."""
    started = time.perf_counter()
    ingest_dir = require_output(config, "ingest")
    out_dir = stage_dir(config, "pseudo-label")
    if unlabeled_path(ingest_dir) is None:
        raise MissingInputError(
            f"no unlabeled reviews in {ingest_dir}/ (set IMDB_UNSUP_ARCHIVE or "
            "data.unlabeled_archive and rerun `make ingest tokenize`)"
        )
    settings = config.pseudo_label
    logged = settings.teacher not in PSEUDO_LABEL_TEACHERS  # a model's URI: loaded, not fitted
    inputs, config_hash = stage_identity(config, ingest_dir, logged)
    outputs = [PSEUDO_LABELS_FILE] + ([PSEUDO_CROPS_FILE] if settings.crops_per_review else [])
    if not force and is_up_to_date(out_dir, config_hash, inputs, outputs):
        print(f"pseudo-label: up to date, nothing to do ({out_dir}/ with config {config_hash})")
        return out_dir

    train = read_split(ingest_dir, "train", columns=["text", "label"])
    val = read_split(ingest_dir, "val", columns=["text", "label"])
    unlabeled = read_unlabeled(ingest_dir, columns=["text"])
    if unlabeled is None:  # checked above: unlabeled_path(ingest_dir) is not None
        raise MissingInputError(f"no unlabeled reviews in {ingest_dir}/ (rerun `make ingest tokenize`)")
    names = load_labels(ingest_dir)
    print(
        f"pseudo-label: loading the teacher {settings.teacher}"
        if logged
        else f"pseudo-label: fitting the {settings.teacher} teacher on {len(train):,} train reviews"
    )
    teacher = load_teacher(config.pseudo_label, config.nbsvm, train, val, names)
    val_accuracy = float(
        (teacher(val["text"].tolist(), "teacher: val").argmax(axis=1) == val["label"].to_numpy()).mean()
    )
    probabilities = teacher(unlabeled["text"].tolist(), "teacher: unlabeled")
    kept = confident_rows(probabilities, len(names), settings)
    if kept.empty:
        print(
            f"pseudo-label: warning: no unlabeled review reached pseudo_label.min_confidence "
            f"{settings.min_confidence:g}; training with pseudo labels will refuse this empty set"
        )
    class_counts = {names[c]: int(n) for c, n in zip(*np.unique(kept["label"], return_counts=True))}
    metrics = labelling_metrics(val_accuracy, kept, len(unlabeled))

    setup_tracking(config.tracking)
    with mlflow.start_run(
        run_name=f"pseudo-label-{'model' if logged else settings.teacher}", nested=mlflow.active_run() is not None
    ) as active:
        mlflow.set_tags(
            {
                STAGE_TAG: PSEUDO_LABEL_STAGE,
                "teacher": settings.teacher,
                "ingest_manifest": inputs["ingest_manifest_sha256"][:16],
            }
        )
        mlflow.log_params({k: v for k, v in flat_params(config).items() if k.startswith("pseudo_label.")})
        mlflow.log_metrics(metrics)
        with staged_directory(out_dir) as staging:
            kept.to_parquet(staging / PSEUDO_LABELS_FILE, index=False)
            if settings.crops_per_review:
                training_crops(train, settings, config.nbsvm, len(names)).to_parquet(
                    staging / PSEUDO_CROPS_FILE, index=False
                )
            scored = probabilities[~np.isnan(probabilities).any(axis=1)]
            plot = plot_confidence(
                scored.max(axis=1),
                settings.min_confidence,
                f"{settings.teacher} teacher (val accuracy {val_accuracy:.4f}): "
                f"{len(kept):,} of {len(unlabeled):,} kept",
                staging / PLOT_FILE,
            )
            mlflow.log_artifact(str(plot), "plots")
            write_manifest(
                staging,
                build_manifest(
                    STAGE,
                    config_hash,
                    inputs,
                    {"pseudo_label": config.to_dict()["pseudo_label"]},
                    mlflow_run_id=active.info.run_id,
                    unlabeled_rows=len(unlabeled),
                    class_counts=class_counts,
                    **{k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()},
                ),
            )
    sampled = f" (a sample of at most {settings.max_rows:,})" if settings.max_rows else ""
    print(
        f"pseudo-label: read {len(train):,} train / {len(val):,} val / {len(unlabeled):,} unlabeled reviews from "
        f"{ingest_dir}/; teacher val accuracy {val_accuracy:.4f}; wrote {len(kept):,} pseudo labels "
        f"({class_counts}) with confidence >= {settings.min_confidence:g}{sampled} "
        f"to {out_dir}/{PSEUDO_LABELS_FILE} and MLflow run "
        f"{active.info.run_id} in {time.perf_counter() - started:.0f}s"
    )
    return out_dir


def with_pseudo_labels(config: Config, make: bool = True, stage: str = "train") -> Config:
    """The config a training run uses: with ``training.pseudo_labels`` on, the pseudo labels made (or found up to
    date) first; when the ingested data holds no unlabeled reviews (a table without them, an archive read without
    ``train/unsup``), the same config without distillation, said in one line, so the run records what it did.
    ``make`` False (the workers of a training cluster, which must not write one folder together) leaves the labels
    to ``make pseudo-label``, run before. ``stage`` (the one asking) says in a line of its own that it runs them."""
    if not config.training.pseudo_labels:
        return config
    ingest_dir = require_output(config, "ingest")
    if unlabeled_path(ingest_dir) is None:
        print(
            f"{stage}: no unlabeled reviews in {ingest_dir}/, so no distillation (training.pseudo_labels off for "
            "this run); IMDB_UNSUP_ARCHIVE or data.unlabeled_archive and `make ingest tokenize` add them"
        )
        return config.replace(training={"pseudo_labels": False})
    if make:
        print(f"{stage}: running the pseudo-label stage first (training.pseudo_labels)")
        pseudo_label(config)  # skipped when up to date
    return config


# --------------------------------------------------------------------------- pseudo labels


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.float32)[np.asarray(labels, dtype=np.int64)]
