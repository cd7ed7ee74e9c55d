"""``make ingest``: the IMDB archive (or the user's own tables) -> versioned Parquet splits.

Reads:  ``data.source: imdb``: an aclImdb ``.tar.gz`` or ``aclImdb/`` folder (``data.archive``,
        ``$IMDB_ARCHIVE``, ``data/raw/aclImdb_v1.tar.gz``, or the canonical download, in that
        order); ``data.source: table``: CSV/TSV/Parquet file(s) at ``data.path`` (see tables.py).
        Unlabeled reviews (``train/unsup``, for pretraining): ``data.unlabeled_archive`` or
        ``$IMDB_UNSUP_ARCHIVE`` when set, else the labeled archive's own ``train/unsup`` when it has one
        (the canonical archive does).
Writes: ``data/ingest/{train,val,test}.parquet`` (columns ``review_id``, ``text``, ``label``
        (class index), ``label_name``, ``rating``, ``source_file``), ``unlabeled.parquet`` (``text``,
        when there are unlabeled reviews), ``labels.json`` (class names, index order) and
        ``data/ingest/manifest.json``.

The archive is streamed member by member and never extracted, so no member path can
write anywhere; members whose paths would escape an extraction folder (``..``,
absolute paths, links, devices) are still rejected because such an archive is not
one we should trust. The validation split is a stratified, seeded fraction of train;
the test split is only ever read for final evaluation.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.ingestion import ingest


def run(config: Config, force: bool = False) -> Path:
    return ingest(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
