"""The probe behind the cascade's share (``compare.cascade_share``): a finished comparison's stored predictions of one
Transformer run and NBSVM, fused as ``make compare`` fuses them (``choose_fusion``, ``compare.short_fusion_words``),
then made a cascade at each share of a grid (``cascade``). Prints one line per share: the validation figures the share
is chosen on (cross-fitted accuracy, validation crops), the share of each set the Transformer reads, and the test
figures, reported, never chosen on. The chosen share: the smallest whose validation accuracy and validation-crops
accuracy are both within ``compare.champion_tolerance`` of the fusion of every text (share 1).

Run it from a checkout whose comparison finished, for example:

    .venv/bin/python docs/history/cascade_probe.py --config configs/short_texts.yaml --transformer <run id>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's pipeline package

from pipeline.config import load_config  # noqa: E402
from pipeline.core.predictions import from_probability_columns  # noqa: E402
from pipeline.metrics import mcnemar_exact  # noqa: E402
from pipeline.stages.compare.fusion_weights import EvaluatedRows, PartScores, cascade, choose_fusion  # noqa: E402
from pipeline.text.crops import word_counts  # noqa: E402

SHARES = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0)


def part(folder: Path, names: list[str]) -> tuple[PartScores, pd.DataFrame]:
    crops = pd.read_parquet(folder / "crop_predictions.parquet")
    scores = PartScores(
        from_probability_columns(pd.read_parquet(folder / "val_predictions.parquet"), names),
        from_probability_columns(pd.read_parquet(folder / "test_predictions.parquet"), names),
        {split: from_probability_columns(crops[crops["split"] == split], names) for split in ("val", "test")},
    )
    return scores, crops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/short_texts.yaml")
    parser.add_argument("--transformer", required=True, help="the Transformer run id (its reports folder)")
    parser.add_argument("--nbsvm", default=None, help="NBSVM's reports folder name (default: the one there)")
    args = parser.parse_args()
    config = load_config(Path(args.config), [])
    reports = config.reports_dir
    nbsvm_folder = reports / args.nbsvm if args.nbsvm else next(reports.glob("baseline-nbsvm-*"))
    names = json.loads((nbsvm_folder / "labels.json").read_text())["labels"]
    transformer, crops = part(reports / args.transformer, names)
    lexical, _ = part(nbsvm_folder, names)
    val = pd.read_parquet(config.data_dir / "ingest" / "val.parquet")
    test = pd.read_parquet(config.data_dir / "ingest" / "test.parquet")
    val_crops = crops[crops["split"] == "val"]
    rows = EvaluatedRows(
        val["label"].to_numpy(),
        word_counts(val["text"].tolist()),
        word_counts(test["text"].tolist()),
        {split: crops.loc[crops["split"] == split, "words"].to_numpy() for split in ("val", "test")},
        val_crops["label"].to_numpy(),
        val_crops["review"].to_numpy(),
    )
    test_crop_labels = crops.loc[crops["split"] == "test", "label"].to_numpy()
    choice = choose_fusion(transformer, lexical, rows, config.compare.fusion_weights, config.compare.short_fusion_words)

    def accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
        return float((probabilities.argmax(axis=1) == labels).mean())

    every = {
        "val": choice.honest,
        "val_crops": accuracy(choice.crops["val"], rows.crop_labels),
        "test_right": choice.test.argmax(axis=1) == test["label"].to_numpy(),
    }
    figures = []
    for share in SHARES:
        cascaded = cascade(choice, lexical, rows, share)
        right = cascaded.choice.test.argmax(axis=1) == test["label"].to_numpy()
        figures.append(
            {
                "share": share,
                "threshold": round(cascaded.threshold, 6),
                "val_cross_fitted": round(cascaded.choice.honest, 4),
                "val_crops": round(accuracy(cascaded.choice.crops["val"], rows.crop_labels), 4),
                "read": {name: round(value, 4) for name, value in cascaded.routed.items()},
                "test": round(float(right.mean()), 4),
                "test_crops": round(accuracy(cascaded.choice.crops["test"], test_crop_labels), 4),
                "test_mcnemar_p_against_every_text": round(mcnemar_exact(right, every["test_right"])["p_value"], 4),
            }
        )
        print(json.dumps(figures[-1]))
    tolerance = config.compare.champion_tolerance
    chosen = min(
        f["share"]
        for f in figures
        if f["val_cross_fitted"] >= every["val"] - tolerance and f["val_crops"] >= every["val_crops"] - tolerance
    )
    print(f"chosen on validation (within {tolerance} of every text on both): share {chosen}")


if __name__ == "__main__":
    main()
