"""``make pretrain``: masked-language modelling of the encoder on the train split and unlabeled reviews.

Reads ``data/tokenize/`` (train and unlabeled ids only); writes ``data/pretrain/`` (the backbone's weights
and spec, the loss curve, a manifest) and one MLflow run. The work, and its files in full: ``pipeline.pretraining``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.pretraining import pretrain


def run(config: Config, force: bool = False) -> Path:
    return pretrain(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
