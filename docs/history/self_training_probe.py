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

Run it from a checkout whose short-texts comparison finished and registered its champion, for example:

    .venv/bin/python docs/history/self_training_probe.py --transformer <run id> --out reports/short_texts/self-training

``--limit N`` runs every step on N reviews of each kind (a check of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's pipeline package

from pipeline.config import load_config  # noqa: E402
from pipeline.core.catalog import PSEUDO_LABELS_FILE, UNLABELED_TABLE  # noqa: E402
from pipeline.core.predictions import (  # noqa: E402
    cascade_rows,
    cascade_threshold,
    from_probability_columns,
    prediction_frame,
)
from pipeline.metrics import champion_choice, mcnemar_exact  # noqa: E402
from pipeline.stages.compare.fusion_weights import EvaluatedRows, PartScores, cascade, choose_fusion  # noqa: E402
from pipeline.stages.evaluate.lengths import crop_frames, crop_predictions  # noqa: E402
from pipeline.text.crops import sentence_crops, word_counts  # noqa: E402
from pipeline.tracking import setup_tracking  # noqa: E402

TARGETS_FILE = "teacher_targets.parquet"


def teacher_targets(
    config, teacher_uri: str, run_id: str, reviews: int, per_review: int, label_weight: float, seed: int
):
    """Crops of ``reviews`` unlabeled reviews (none of the distilled ones) and their soft targets from the teacher."""
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.pseudo_label.teacher import model_probabilities

    unlabeled = pd.read_parquet(config.data_dir / "ingest" / UNLABELED_TABLE)
    distilled = pd.read_parquet(config.data_dir / "pseudo_label" / PSEUDO_LABELS_FILE)["row"].to_numpy()
    free = np.setdiff1d(np.arange(len(unlabeled)), distilled)
    rows = np.sort(np.random.default_rng(seed).choice(free, min(reviews, len(free)), replace=False))
    frame = pd.DataFrame({"text": unlabeled["text"].to_numpy()[rows], "label": 0})
    crops = sentence_crops(frame, seed, per_review)
    teacher = load_classifier(teacher_uri)
    if getattr(teacher, "transformer_run_id", None) != run_id:
        sys.exit(f"error: the teacher {teacher_uri} does not fuse round 1's Transformer (run {run_id})")
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
            out / f"{name}_predictions.parquet"
        )
    crop_predictions(crops, crop_p, names).to_parquet(out / "crop_predictions.parquet")
    return time.perf_counter() - started


def part(folder: Path, names: list[str], splits: dict[str, pd.DataFrame]) -> tuple[PartScores, pd.DataFrame]:
    """A folder's stored predictions on the rows of ``splits`` (matched by source file, in the splits' order)."""
    kept = {}
    for split, frame in splits.items():
        stored = pd.read_parquet(folder / f"{split}_predictions.parquet").set_index("source_file")
        kept[split] = stored.loc[frame["source_file"]]
    crops = pd.read_parquet(folder / "crop_predictions.parquet")
    crops = pd.concat(
        [
            crops[(crops["split"] == split) & crops["source_file"].isin(set(frame["source_file"]))]
            for split, frame in splits.items()
        ],
        ignore_index=True,
    )
    scores = PartScores(
        from_probability_columns(kept["val"], names),
        from_probability_columns(kept["test"], names),
        {split: from_probability_columns(crops[crops["split"] == split], names) for split in ("val", "test")},
    )
    return scores, crops


def compare_rounds(config, folders: dict[str, Path], nbsvm: Path, names, splits: dict[str, pd.DataFrame]) -> dict:
    """Both rounds through the comparison's fusion and cascade; the validation figures, the choice, and the test."""
    val, test = splits["val"], splits["test"]
    lexical, _ = part(nbsvm, names, splits)
    parts = {name: part(folder, names, splits) for name, folder in folders.items()}
    crops = next(iter(parts.values()))[1]
    rows = EvaluatedRows(
        val["label"].to_numpy(),
        word_counts(val["text"].tolist()),
        word_counts(test["text"].tolist()),
        {split: crops.loc[crops["split"] == split, "words"].to_numpy() for split in ("val", "test")},
        crops.loc[crops["split"] == "val", "label"].to_numpy(),
        crops.loc[crops["split"] == "val", "review"].to_numpy(),
    )
    labels = {"test": test["label"].to_numpy(), "crops": crops.loc[crops["split"] == "test", "label"].to_numpy()}
    routed = cascade_rows(lexical.test, cascade_threshold(lexical.val, config.compare.cascade_share))
    figures, right = {}, {}
    for name, (scores, _) in parts.items():
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
        sys.exit(f"error: {out}/ holds a probe run with other arguments ({out / 'args.json'}); use another --out")
    (out / "args.json").write_text(json.dumps(made_by, indent=1))
    nbsvm = next(reports.glob("baseline-nbsvm-*"))
    names = json.loads((nbsvm / "labels.json").read_text())["labels"]
    (out / "labels.json").write_text((nbsvm / "labels.json").read_text())
    splits = {split: pd.read_parquet(config.data_dir / "ingest" / f"{split}.parquet") for split in ("val", "test")}
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
    if not (out / "crop_predictions.parquet").is_file():
        lexical, _ = part(nbsvm, names, read)
        routed = cascade_rows(lexical.test, cascade_threshold(lexical.val, config.compare.cascade_share))
        round1, _ = part(reports / args.transformer, names, read)
        student, log["train_seconds"], log["steps"] = fine_tune_again(config, args.transformer, targets, args.seed)
        log["evaluate_seconds"] = write_predictions(student, splits, args.limit, names, out, routed, round1.test)
        log["test_reviews_scored"] = int(routed.sum())
    log["rows"] = len(targets)
    log.update(compare_rounds(config, {"round1": reports / args.transformer, "round2": out}, nbsvm, names, read))
    (out / "result.json").write_text(json.dumps(log, indent=1))
    print(json.dumps(log))


if __name__ == "__main__":
    main()
