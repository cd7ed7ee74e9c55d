"""The probe behind history/short-texts.md's self-training rows: a second round of fine-tuning for
a finished short-texts comparison's Transformer, on sentence crops of unlabeled reviews it never trained on, with the
comparison's fused champion as the teacher. Then the comparison's protocol on both rounds: each fused with the same
NBSVM (``choose_fusion``, ``compare.short_fusion_words``) and made a cascade at ``compare.cascade_share``; the round
to keep is the one ``champion_choice`` picks on validation alone (cross-fitted validation accuracy within
``compare.champion_tolerance`` of the better, then the better validation crops); test figures and McNemar's exact
test against round 1 on the 25,000 test reviews and their crops are reported, never chosen on.

A crop's soft target: ``--label-weight`` times the teacher's probabilities for the whole review it was cut from (the
review's label stands there for train crops, ``pseudo_label.crop_label_weight``) plus the rest times the teacher's
probabilities for the crop itself. The unlabeled reviews are drawn from those ``make pseudo-label`` did not distil.

Reads the comparison's reports folders (``lab.probes.stored_runs``), the ingested splits and unlabeled reviews, the
pseudo-label stage's distilled rows and the registered champion; writes the teacher's targets, round 2's predictions
(as ``make evaluate`` names them), ``args.json`` and ``result.json`` to ``--out``. Run it from a checkout whose
short-texts comparison finished and registered its champion, for example:

    .venv/bin/python -m lab.probes.self_training --transformer <run id> --out reports/short_texts/self-training

``--limit N`` runs every step on N reviews of each kind (a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.probes.stored_runs import PREDICTION_FILES, nbsvm_folder, stored_candidate
from pipeline.config import load_config
from pipeline.core.catalog import CROP_PREDICTIONS_FILE, LABELS_FILE, PSEUDO_LABELS_FILE, stage_dir
from pipeline.core.errors import InputError, PipelineError
from pipeline.core.predictions import cascade_rows, cascade_threshold, prediction_frame
from pipeline.metrics import champion_choice, mcnemar_exact
from pipeline.stages.compare.candidates import NBSVM
from pipeline.stages.compare.fusion_weights import cascade, choose_fusion
from pipeline.stages.compare.producers import evaluated_rows, part_scores
from pipeline.stages.evaluate.lengths import crop_frames, crop_predictions
from pipeline.stages.ingest.outputs import read_split, read_unlabeled
from pipeline.stages.tokenize.outputs import read_ingested_rows
from pipeline.text.conventions import load_labels
from pipeline.text.crops import sentence_crops
from pipeline.tracking import setup_tracking

TARGETS_FILE = "teacher_targets.parquet"


def teacher_targets(
    config, teacher_uri: str, run_id: str, reviews: int, per_review: int, label_weight: float, seed: int
):
    """Crops of ``reviews`` unlabeled reviews (none of the distilled ones) and their soft targets from the teacher."""
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.pseudo_label.teacher import model_probabilities

    unlabeled = read_unlabeled(stage_dir(config, "ingest"), ["text"])
    if unlabeled is None:
        raise InputError(f"no unlabeled reviews in {stage_dir(config, 'ingest')}/: ingest them (data.unlabeled)")
    distilled = pd.read_parquet(stage_dir(config, "pseudo-label") / PSEUDO_LABELS_FILE, columns=["row"])["row"]
    free = np.setdiff1d(np.arange(len(unlabeled)), distilled.to_numpy())
    rows = np.sort(np.random.default_rng(seed).choice(free, min(reviews, len(free)), replace=False))
    frame = pd.DataFrame({"text": unlabeled["text"].to_numpy()[rows], "label": 0})
    crops = sentence_crops(frame, seed, per_review)
    teacher = load_classifier(teacher_uri)
    if getattr(teacher, "transformer_run_id", None) != run_id:
        raise InputError(f"the teacher {teacher_uri} does not fuse round 1's Transformer (run {run_id})")
    started = time.perf_counter()
    review_p = model_probabilities(teacher, frame["text"].tolist(), "teacher: reviews")
    crop_p = model_probabilities(teacher, crops["text"].tolist(), "teacher: crops")
    seconds = time.perf_counter() - started
    targets = label_weight * review_p[crops["review"].to_numpy()] + (1.0 - label_weight) * crop_p
    keep = ~np.isnan(targets).any(axis=1)
    out = pd.DataFrame({"text": crops["text"], "unlabeled_row": rows[crops["review"].to_numpy()]})
    out["target_0"], out["target_1"] = targets[:, 0], targets[:, 1]
    return out[keep].reset_index(drop=True), seconds


def fine_tune_again(config, run_id: str, targets: pd.DataFrame, seed: int):
    """The run's Transformer fine-tuned one more epoch on ``targets``; returns the loaded classifier (its Keras
    model trained in place) and the training seconds."""
    import keras

    from pipeline.model.classifiers import load_classifier
    from pipeline.model.fit import compile_model
    from pipeline.runtime.datasets import make_dataset

    student = load_classifier(f"runs:/{run_id}/model")
    if student.transformer_part is not student:
        raise InputError(f"run {run_id} logged no Transformer (its model is a {type(student).__name__})")
    ids = student.text_tokenizer.encode(targets["text"].tolist())
    soft = targets[["target_0", "target_1"]].to_numpy(np.float32)
    batch_size = config.training.batch_size
    steps = -(-len(ids) // batch_size)
    dataset = make_dataset(ids, soft, batch_size, seed, config.training.length_multiple)
    keras.utils.set_random_seed(seed)
    model = compile_model(student.model, config.training, True, steps, soft_targets=True, epochs=1)
    print(f"round 2: {len(ids):,} crops, {steps:,} steps of {batch_size}", flush=True)
    started = time.perf_counter()
    model.fit(dataset, epochs=1, verbose=2)
    return student, time.perf_counter() - started, steps


def picked(length: int, limit: int | None) -> np.ndarray:
    """The rows a run reads of a split: all, or with ``limit`` the first and last ``limit // 2`` (the splits are
    stored in label order, so both classes)."""
    if limit is None or limit >= length:
        return np.arange(length)
    return np.r_[0 : limit // 2, length - limit // 2 : length]


def write_predictions(
    student, splits: dict[str, pd.DataFrame], limit, names: list[str], out: Path, routed: np.ndarray, round1_test
) -> float:
    """The evaluation's three prediction files for the fine-tuned model, as ``evaluate_model`` writes them (crops drawn
    on the whole splits, so each row's crop is the one round 1 read). Of the test reviews only the ``routed`` ones,
    those the cascade gives the Transformer, are scored; the rest keep round 1's probabilities, which the cascade
    never reads (NBSVM answers them), so the cascade's figures are exact and the Transformer's own test figure is
    reported on the routed reviews only."""
    started = time.perf_counter()
    crops = crop_frames(splits["val"], splits["test"])
    crops = {split: frame[frame["review"].isin(picked(len(splits[split]), limit))] for split, frame in crops.items()}
    crop_p = {split: student.probabilities(frame["text"].tolist()) for split, frame in crops.items()}
    for name, frame in splits.items():
        frame = frame.iloc[picked(len(frame), limit)]
        if name == "test":
            probabilities = np.asarray(round1_test, dtype=np.float32).copy()
            probabilities[routed] = student.probabilities(frame["text"].to_numpy()[routed].tolist())
        else:
            probabilities = student.probabilities(frame["text"].tolist())
        prediction_frame(frame["source_file"], frame["label"].to_numpy(), probabilities, names).to_parquet(
            out / PREDICTION_FILES[name]
        )
    crop_predictions(crops, crop_p, names).to_parquet(out / CROP_PREDICTIONS_FILE)
    return time.perf_counter() - started


def compare_rounds(config, folders: dict[str, Path], nbsvm: Path, names, splits: dict[str, pd.DataFrame]) -> dict:
    """Both rounds through the comparison's fusion and cascade; the validation figures, the choice, and the test."""
    lexical = part_scores(stored_candidate(nbsvm, splits, NBSVM), names)
    candidates = {name: stored_candidate(folder, splits) for name, folder in folders.items()}
    round1 = next(iter(candidates.values()))
    ingested = read_ingested_rows(stage_dir(config, "ingest"), stage_dir(config, "tokenize"))
    rows = evaluated_rows(dataclasses.replace(ingested, val=splits["val"], test=splits["test"]), round1)
    crops = round1.crop_predictions()
    labels = {
        "test": splits["test"]["label"].to_numpy(),
        "crops": crops.loc[crops["split"] == "test", "label"].to_numpy(),
    }
    routed = cascade_rows(lexical.test, cascade_threshold(lexical.val, config.compare.cascade_share))
    figures: dict[str, dict[str, Any]] = {}
    right: dict[str, dict[str, np.ndarray]] = {}
    for name, candidate in candidates.items():
        scores = part_scores(candidate, names)
        choice = choose_fusion(scores, lexical, rows, config.compare.fusion_weights, config.compare.short_fusion_words)
        fused = cascade(choice, lexical, rows, config.compare.cascade_share).choice
        right[name] = {
            "test": fused.test.argmax(axis=1) == labels["test"],
            "crops": fused.crops["test"].argmax(axis=1) == labels["crops"],
            "alone_test_routed": scores.test[routed].argmax(axis=1) == labels["test"][routed],
            "alone_crops": scores.crops["test"].argmax(axis=1) == labels["crops"],
        }
        figures[name] = {
            "weights": [round(choice.weight, 3), round(choice.short_weight, 3)],
            "val_cross_fitted": round(fused.honest, 4),
            "val_crops": round(float((fused.crops["val"].argmax(axis=1) == rows.crop_labels).mean()), 4),
            "alone_val": round(float((scores.val.argmax(axis=1) == rows.val_labels).mean()), 4),
            "alone_val_crops": round(float((scores.crops["val"].argmax(axis=1) == rows.crop_labels).mean()), 4),
            **{key: round(float(value.mean()), 4) for key, value in right[name].items()},
        }
    chosen = champion_choice(
        {name: f["val_cross_fitted"] for name, f in figures.items()},
        {name: f["val_crops"] for name, f in figures.items()},
        config.compare.champion_tolerance,
    )
    first, second = folders
    tests = {
        key: mcnemar_exact(right[first][key], right[second][key])
        for key in ("test", "crops", "alone_test_routed", "alone_crops")
    }
    return {"figures": figures, "chosen_on_validation": chosen, f"mcnemar_{first}_vs_{second}": tests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/short_texts.yaml")
    parser.add_argument("--transformer", required=True, help="round 1: the comparison's Transformer run id")
    parser.add_argument("--teacher", default=None, help="default: models:/<registered name>@champion")
    parser.add_argument("--reviews", type=int, default=20_000, help="unlabeled reviews to crop")
    parser.add_argument("--crops-per-review", type=int, default=2)
    parser.add_argument("--label-weight", type=float, default=0.5, help="on the teacher's whole-review answer")
    parser.add_argument("--learning-rate", type=float, default=2e-5, help="round 2's peak (after 10 %% warm-up)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit", type=int, default=None, help="a quick check: this many reviews of each kind")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = load_config(Path(args.config), []).replace(
        training={"fine_tune_learning_rate": args.learning_rate, "seed": args.seed}
    )
    setup_tracking(config.tracking)
    reports, out = config.reports_dir, args.out
    out.mkdir(parents=True, exist_ok=True)
    made_by = {k: str(v) for k, v in vars(args).items() if k != "out"}
    if (out / "args.json").is_file() and json.loads((out / "args.json").read_text()) != made_by:
        raise InputError(f"{out}/ holds a probe run with other arguments ({out / 'args.json'}); use another --out")
    (out / "args.json").write_text(json.dumps(made_by, indent=1))
    nbsvm = nbsvm_folder(reports)
    names = load_labels(nbsvm)
    shutil.copyfile(nbsvm / LABELS_FILE, out / LABELS_FILE)
    splits = {split: read_split(stage_dir(config, "ingest"), split) for split in PREDICTION_FILES}
    log: dict = {"args": made_by}
    if (out / TARGETS_FILE).is_file():
        targets = pd.read_parquet(out / TARGETS_FILE)
    else:
        teacher = args.teacher or f"models:/{config.tracking.registered_model_name}@champion"
        reviews = args.limit or args.reviews
        targets, log["teacher_seconds"] = teacher_targets(
            config, teacher, args.transformer, reviews, args.crops_per_review, args.label_weight, args.seed
        )
        targets.to_parquet(out / TARGETS_FILE)
    read = {split: frame.iloc[picked(len(frame), args.limit)] for split, frame in splits.items()}
    if not (out / CROP_PREDICTIONS_FILE).is_file():
        lexical = part_scores(stored_candidate(nbsvm, read, NBSVM), names)
        routed = cascade_rows(lexical.test, cascade_threshold(lexical.val, config.compare.cascade_share))
        round1 = part_scores(stored_candidate(reports / args.transformer, read), names)
        student, log["train_seconds"], log["steps"] = fine_tune_again(config, args.transformer, targets, args.seed)
        log["evaluate_seconds"] = write_predictions(student, splits, args.limit, names, out, routed, round1.test)
        log["test_reviews_scored"] = int(routed.sum())
    log["rows"] = len(targets)
    log.update(compare_rounds(config, {"round1": reports / args.transformer, "round2": out}, nbsvm, names, read))
    (out / "result.json").write_text(json.dumps(log, indent=1))
    print(json.dumps(log))


if __name__ == "__main__":
    try:
        main()
    except PipelineError as error:  # a bad run id, model URI or folder: one line, as the stages say it
        sys.exit(f"error: {error}")
