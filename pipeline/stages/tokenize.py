"""``make tokenize``: a WordPiece vocabulary learned on train, and fixed-length token ids for every split.

Reads:  ``data/ingest/{train,val,test}.parquet``, ``unlabeled.parquet`` when ingestion wrote one, and
        the manifest. The vocabulary is learned on train plus (``tokenizer.include_unlabeled``) the
        unlabeled reviews, never on validation or test texts.
Writes: ``data/tokenize/vocabulary.txt``, ``tokenizer.json`` (``pipeline.tokenizer``), ``{split}_ids.npy``
        (int32, ``[rows, max_sequence_length]``; also ``unlabeled_ids.npy``), ``{split}_labels.npy``
        (class indices), ``{split}_token_counts.npy`` (tokens before truncation), ``labels.json`` (class
        names, copied from ingest), ``token_lengths.png`` and ``manifest.json``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.tokenization import tokenize


def run(config: Config, force: bool = False) -> Path:
    return tokenize(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
