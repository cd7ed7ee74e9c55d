"""``make tokenize``: a WordPiece vocabulary learned on train, and fixed-length token ids for every split.

Reads ``data/ingest/``; writes ``data/tokenize/`` (vocabulary, ``tokenizer.json``, ids, labels and token
counts per split, a plot, a manifest). The work, and its files in full: ``pipeline.stages.tokenize.vocabulary``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.stages.tokenize.vocabulary import tokenize


def run(config: Config, force: bool = False) -> Path:
    return tokenize(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
