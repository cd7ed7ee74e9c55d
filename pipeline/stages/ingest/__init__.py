"""``make ingest``: the IMDB archive (or the user's own tables) -> versioned Parquet splits.

Reads the aclImdb archive or folder, or ``data.path`` tables, and the unlabeled reviews; writes
``data/ingest/`` (``{train,val,test}.parquet``, ``unlabeled.parquet``, ``labels.json``, a manifest).
The work, and its files in full: ``pipeline.stages.ingest.splits`` (the archive itself:
``pipeline.stages.ingest.imdb``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def run(config: Config, force: bool = False) -> Path:
    from pipeline.stages.ingest.splits import ingest

    return ingest(config, force=force)


def main(config: Config, args) -> None:
    run(config, force=args.force)
