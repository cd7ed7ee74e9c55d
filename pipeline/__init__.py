"""Keras sentiment-classification pipeline: ingest, tokenize, train, evaluate, compare, score.

The map of the package is in ``docs/design.md``: ``stages/`` (one package per ``make`` target), the shared
libraries grouped by concern (``core``, ``config``, ``text``, ``model``, ``runtime``, ``lexical``, ``metrics``,
``tracking``) and ``experiments/``.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types

__version__ = "0.1.0"

# Modules that moved, under the names that logged models pickled their classes with (an MLflow pyfunc model
# names ``pipeline.inference.SentimentClassifier``, a saved NBSVM ``pipeline.baseline.NaiveBayesLogisticRegression``).
# Only unpickling reaches these names; the code imports the new ones.
MOVED_MODULES = {"pipeline.inference": "pipeline.model.classifiers", "pipeline.baseline": "pipeline.lexical"}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of a moved module's old name with a module whose attributes are the new module's."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec):
        moved = importlib.import_module(MOVED_MODULES[spec.name])
        module = types.ModuleType(spec.name, f"Moved to {moved.__name__}.")
        module.__getattr__ = lambda name: getattr(moved, name)  # PEP 562: everything is read from the new module
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
