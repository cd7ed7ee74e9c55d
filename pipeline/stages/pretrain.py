"""Pretraining stage: masked-language modelling of the encoder on the train split and unlabeled reviews.

Reads:  ``data/tokenize/`` (``train_ids.npy``, ``unlabeled_ids.npy`` when ingestion found unlabeled
        reviews, the vocabulary). Validation and test texts are never used.
Writes: ``data/pretrain/`` holding ``backbone.weights.npz`` (the encoder's weights by layer name),
        ``backbone.json`` (its shape, vocabulary checksum and MLflow run), ``history.json``,
        ``loss_curve.png`` and ``manifest.json``; an MLflow run with the masked-LM loss and
        masked-token accuracy every ``pretrain.log_every_steps`` steps, throughput, and the backbone
        files as artifacts under ``backbone/`` (so ``runs:/<run_id>/backbone`` can be fine-tuned from).

BERT-style masking with KerasHub's ``MaskedLMMaskGenerator`` (15 % of real tokens selected; of
those 80 % become ``[MASK]``, 10 % a random token, 10 % stay) and ``MaskedLMHead`` tied to the
token embedding (``pipeline.model.build_masked_lm``). The same function builds the backbone of
the classifier, so ``make train`` with ``model.init: pretrained`` starts from these weights.

Budgeted and resumable: training stops after ``pretrain.max_minutes`` of training time or
``pretrain.max_steps`` steps, whichever comes first; a checkpoint is written every
``log_every_steps`` steps, and a killed run resumes from it (same MLflow run, time already spent
counted). A finished pretraining with the same inputs and config is not repeated.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.pretraining import pretrain


def run(config: Config, force: bool = False) -> Path:
    return pretrain(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
