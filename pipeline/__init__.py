"""Keras sentiment-classification pipeline: ingest, tokenize, train, evaluate, compare, score.

The map of the package is in ``docs/design.md``: ``stages/`` (one package per ``make`` target), the shared
libraries grouped by concern (``core``, ``config``, ``text``, ``model``, ``runtime``, ``lexical``, ``metrics``,
``tracking``). The experiments that study it live in the lab beside it (``lab/``), which this package never imports.
"""

__version__ = "0.1.0"

from pipeline.core import old_models  # noqa: E402  (after __version__, which pipeline.core.files reads)

old_models.install()  # logged models pickled under names that have moved since (pipeline.core.old_models)
