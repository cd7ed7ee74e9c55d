"""``make pretrain``: masked-language modelling of the encoder on the train split and unlabeled reviews.

Reads ``data/tokenize/`` (train and unlabeled ids only); writes ``data/pretrain/`` (the backbone's weights
and spec, the loss curve, a manifest) and one MLflow run. The work, and its files in full:
``pipeline.stages.pretrain.masked_lm``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def run(config: Config, force: bool = False) -> Path:
    from pipeline.stages.pretrain.masked_lm import pretrain

    return pretrain(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
