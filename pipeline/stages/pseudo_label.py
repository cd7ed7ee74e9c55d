"""Pseudo-label stage: self-training data for the classifier from the unlabeled reviews.

Reads:  ``data/ingest/`` (``train.parquet``, ``val.parquet``, ``unlabeled.parquet``, manifest).
        Test texts are never read.
Writes: ``data/pseudo_label/`` holding ``pseudo_labels.parquet`` (``row``: the review's row in
        ``unlabeled.parquet`` and so in ``data/tokenize/unlabeled_ids.npy``;
        ``label``: the class index; ``confidence``: the teacher's probability of it;
        ``probability_<index>``: its probability of every class, the soft targets) for the
        reviews the teacher is at least ``pseudo_label.min_confidence`` sure of,
        ``teacher_confidence.png`` and ``manifest.json``; one MLflow run with the teacher's
        validation accuracy, how many reviews were kept and the plot.

The teacher is the comparison's NBSVM baseline (``pseudo_label.teacher: nbsvm``; ``tfidf`` for the
TF-IDF + logistic regression one), fitted on the train split only. With ``training.pseudo_labels: true``
the classifier trains on the train split plus these reviews, on the teacher's probabilities with
``pseudo_label.soft`` (distillation) or its labels without, and is still chosen on the untouched
validation split.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.pseudo_labels import pseudo_label


def run(config: Config, force: bool = False) -> Path:
    return pseudo_label(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
