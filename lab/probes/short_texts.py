"""The probe behind history/short-texts.md's training-cost rows: a preset fine-tuned for one epoch on a fixed random
fraction of a short-texts run's training mix (train reviews one-hot, distilled reviews and train-review crops with
the teacher's soft targets, as ``make train`` builds it), then scored on the validation reviews and their crops (the
evaluation's crop draw). Prints one JSON line and saves both probability arrays for McNemar's test between variants.

Reads the tokenize and pseudo-label stages' outputs and the ingested validation split; writes the two arrays to
``--out``. Run it from a checkout whose short-texts stages ran up to pseudo-label (``make pseudo-label
CONFIG=configs/short_texts.yaml``), for example:

    .venv/bin/python -m lab.probes.short_texts --seed 1 --fraction 0.1 --out probe/

Its ``--blocks`` (fewer of the preset's blocks) went with ``model.preset_blocks``, retired after this probe showed it
lost accuracy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from pipeline.config import load_config
from pipeline.core.catalog import stage_dir
from pipeline.model.fit import compile_model
from pipeline.model.forward import predict_ids
from pipeline.model.preset_classifier import preset_classifier
from pipeline.runtime.datasets import make_dataset
from pipeline.stages.evaluate.lengths import validation_crops
from pipeline.stages.ingest.outputs import read_split
from pipeline.stages.pseudo_label.outputs import load_pseudo_labels, load_training_crops
from pipeline.stages.pseudo_label.teacher import one_hot
from pipeline.stages.tokenize.outputs import load_split
from pipeline.text.text_tokenizer import load_text_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/short_texts.yaml")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fraction", type=float, default=0.1, help="of each part of the mix (the same draw each run)")
    parser.add_argument("--crops-kept", type=float, default=1.0, help="the part of the drawn crops kept")
    parser.add_argument("--out", type=Path, default=Path("probe"))
    parser.add_argument("--xla", action="store_true", help="time training steps with jit_compile off and on instead")
    args = parser.parse_args()
    overrides = [f"training.seed={args.seed}"]
    config = load_config(args.config, overrides)
    if args.xla:
        print(json.dumps(xla_steps(config)))
        return
    tokenize_dir, pseudo_dir = stage_dir(config, "tokenize"), stage_dir(config, "pseudo-label")
    tokenizer = load_text_tokenizer(tokenize_dir)
    train_ids, train_labels = load_split(tokenize_dir, "train")
    distilled_ids, distilled_targets, _ = load_pseudo_labels(pseudo_dir, tokenize_dir, 2, True)
    crop_texts, crop_targets = load_training_crops(pseudo_dir, 2)
    draw = np.random.default_rng(0)  # the same rows for every variant and seed

    def part(rows: int) -> np.ndarray:
        return np.sort(draw.choice(rows, int(rows * args.fraction), replace=False))

    reviews, distilled, crops = part(len(train_ids)), part(len(distilled_ids)), part(len(crop_texts))
    # a random part of the drawn crops (the crops file is in review order, and the reviews in label order)
    crops = np.sort(np.random.default_rng(1).choice(crops, int(len(crops) * args.crops_kept), replace=False))
    ids = np.concatenate(
        [train_ids[reviews], distilled_ids[distilled], tokenizer.encode([crop_texts[i] for i in crops])]
    )
    targets = np.concatenate([one_hot(train_labels[reviews], 2), distilled_targets[distilled], crop_targets[crops]])
    batch_size = config.training.batch_size
    steps = -(-len(ids) // batch_size)
    dataset = make_dataset(ids, targets.astype(np.float32), batch_size, args.seed, config.training.length_multiple)
    import keras

    keras.utils.set_random_seed(args.seed)
    model = preset_classifier(config.model, tokenizer, 2, on_cpu=True)
    model = compile_model(model, config.training, True, steps, soft_targets=True)
    started = time.perf_counter()
    model.fit(dataset, epochs=1, verbose=0)
    train_seconds = time.perf_counter() - started
    val = read_split(stage_dir(config, "ingest"), "val")
    val_crops = validation_crops(val)
    started = time.perf_counter()
    reviews_p = predict_ids(model, tokenizer.encode(val["text"].tolist()), compiled=True)
    crops_p = predict_ids(model, tokenizer.encode(val_crops["text"].tolist()), compiled=True)
    result = {
        "seed": args.seed,
        "fraction": args.fraction,
        "crops_kept": args.crops_kept,
        "rows": len(ids),
        "steps": steps,
        "train_seconds": round(train_seconds, 1),
        "ms_per_step": round(1000 * train_seconds / steps),
        "score_seconds": round(time.perf_counter() - started, 1),
        "val_accuracy": float((reviews_p.argmax(1) == val["label"].to_numpy()).mean()),
        "val_crops_accuracy": float((crops_p.argmax(1) == val_crops["label"].to_numpy()).mean()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"seed{args.seed}-fraction{args.fraction}-crops{args.crops_kept}"
    np.save(args.out / f"{name}-val.npy", reviews_p)
    np.save(args.out / f"{name}-crops.npy", crops_p)
    print(json.dumps(result))


def xla_steps(config, warm_up: int = 4, timed: int = 20) -> dict:
    """ms per training step of the configured classifier, ``jit_compile`` off and on, built and compiled twice each
    (off, on, off, on), on the first train reviews (32 per batch, padded to the full width) and constant targets."""
    import keras

    tokenizer = load_text_tokenizer(stage_dir(config, "tokenize"))
    batch_size = config.training.batch_size
    ids = np.asarray(load_split(stage_dir(config, "tokenize"), "train")[0][: batch_size * (warm_up + timed)], np.int32)
    batches = np.split(ids, warm_up + timed)
    targets = np.tile(np.array([[1.0, 0.0]], np.float32), (batch_size, 1))
    steps: dict = {"off": [], "on": []}
    for jit in (False, True, False, True):
        keras.utils.set_random_seed(0)
        classifier = preset_classifier(config.model, tokenizer, 2, on_cpu=True)
        model = compile_model(classifier, config.training, True, 100, soft_targets=True)
        model.compile(optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"], jit_compile=jit)
        for batch in batches[:warm_up]:
            model.train_on_batch(batch, targets)
        started = time.perf_counter()
        for batch in batches[warm_up:]:
            model.train_on_batch(batch, targets)
        steps["on" if jit else "off"].append(round(1000 * (time.perf_counter() - started) / timed))
    return {"ms_per_step": steps}


if __name__ == "__main__":
    main()
