"""The probe behind the cascade's share (``compare.cascade_share``): a finished comparison's stored predictions of one
Transformer run and NBSVM, fused as ``make compare`` fuses them (``choose_fusion``, ``compare.short_fusion_words``),
then made a cascade at each share of a grid (``cascade``, NBSVM's rows cross-fitted over its C where it answers
alone). Prints one line per share: the validation figures the share is chosen on (cross-fitted accuracy, validation
crops), the share of each set the Transformer reads, and the test figures, reported, never chosen on. Then the
comparison's own choice (``choose_cascade``: the smallest share up to the budget within ``compare.champion_tolerance``
of the fusion of every text, its figure cross-fitted over that choice) beside the rule it replaced (``--old-share``,
0.1, with NBSVM's answers at the C chosen on all of validation where it answers alone).

Reads the comparison's reports folders (``lab.probes.stored_runs``) and the ingested splits; writes nothing. Run it
from a checkout whose comparison finished, for example:

    .venv/bin/python -m lab.probes.cascade --config configs/short_texts.yaml --transformer <run id>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from lab.probes.stored_runs import nbsvm_folder, stored_candidate
from pipeline.config import load_config
from pipeline.core.catalog import stage_dir
from pipeline.core.errors import PipelineError
from pipeline.metrics import mcnemar_exact
from pipeline.stages.compare.candidates import NBSVM
from pipeline.stages.compare.fusion_weights import (
    Cascade,
    EvaluatedRows,
    FusionChoice,
    PartScores,
    cascade,
    choose_cascade,
    choose_fusion,
)
from pipeline.stages.compare.producers import evaluated_rows, part_scores
from pipeline.stages.tokenize.outputs import read_ingested_rows
from pipeline.text.conventions import load_labels

SHARES = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0)


def accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float((probabilities.argmax(axis=1) == labels).mean())


def share_figures(
    choice: FusionChoice, lexical: PartScores, rows: EvaluatedRows, labels: dict[str, np.ndarray], share: float
) -> dict:
    """The cascade of ``choice`` at ``share``: its validation figures, what the Transformer reads, its test figures
    and McNemar's test against the fusion of every text on the test reviews."""
    return cascade_figures(choice, cascade(choice, lexical, rows, share), rows, labels)


def cascade_figures(
    choice: FusionChoice, cascaded: Cascade, rows: EvaluatedRows, labels: dict[str, np.ndarray]
) -> dict:
    """A cascade's figures (:func:`share_figures`)."""
    share = cascaded.share
    right = cascaded.choice.test.argmax(axis=1) == labels["test"]
    every_text_right = choice.test.argmax(axis=1) == labels["test"]
    return {
        "share": share,
        "threshold": round(cascaded.threshold, 6),
        "val_cross_fitted": round(cascaded.choice.honest, 4),
        "val_crops": round(accuracy(cascaded.choice.crops["val"], rows.crop_labels), 4),
        "read": {name: round(value, 4) for name, value in cascaded.routed.items()},
        "test": round(float(right.mean()), 4),
        "test_crops": round(accuracy(cascaded.choice.crops["test"], labels["crops"]), 4),
        "test_mcnemar_p_against_every_text": round(mcnemar_exact(right, every_text_right)["p_value"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/short_texts.yaml")
    parser.add_argument("--transformer", required=True, help="the Transformer run id (its reports folder)")
    parser.add_argument("--nbsvm", default=None, help="NBSVM's reports folder name (default: the one there)")
    parser.add_argument("--old-share", type=float, default=0.1, help="the fixed share of the rule replaced")
    args = parser.parse_args()
    config = load_config(Path(args.config), [])
    reports = config.reports_dir
    nbsvm = nbsvm_folder(reports, args.nbsvm)
    names = load_labels(nbsvm)
    frames = read_ingested_rows(stage_dir(config, "ingest"), stage_dir(config, "tokenize"))
    splits = {"val": frames.val, "test": frames.test}
    child = stored_candidate(reports / args.transformer, splits)
    transformer, lexical = part_scores(child, names), part_scores(stored_candidate(nbsvm, splits, NBSVM), names)
    rows = evaluated_rows(frames, child)
    crops = child.crop_predictions()
    labels = {"test": frames.test["label"].to_numpy(), "crops": crops.loc[crops["split"] == "test", "label"].to_numpy()}
    choice = choose_fusion(transformer, lexical, rows, config.compare.fusion_weights, config.compare.short_fusion_words)
    every_text = {"val": choice.honest, "val_crops": accuracy(choice.crops["val"], rows.crop_labels)}
    figures = []
    for share in SHARES:
        figures.append(share_figures(choice, lexical, rows, labels, share))
        print(json.dumps(figures[-1]))
    print(json.dumps({"every_text": every_text}))
    tolerance, budget = config.compare.champion_tolerance, config.compare.cascade_share
    chosen = choose_cascade(choice, lexical, rows, budget, tolerance)
    before = share_figures(choice, dataclasses.replace(lexical, honest_rows=None), rows, labels, args.old_share)
    print(json.dumps({"before": before}))
    print(json.dumps({"after": cascade_figures(choice, chosen, rows, labels)}))
    print(f"chosen: share {chosen.share:g} of {list(chosen.by_share)} (within {tolerance} of every text on both)")


if __name__ == "__main__":
    try:
        main()
    except PipelineError as error:  # a missing folder or output: one line, as the stages say it
        sys.exit(f"error: {error}")
