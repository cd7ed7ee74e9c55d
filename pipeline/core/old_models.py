"""The models logged by earlier versions that must still load, and what makes them load.

A user's registered ``@champion`` has to survive an upgrade. Supported, each with its test:

- MLflow pyfunc models logged since 43f75dd, whose pickles name classes by the module they lived in then
  (``pipeline.inference.SentimentClassifier``, a saved NBSVM's ``pipeline.baseline.NaiveBayesLogisticRegression``):
  :data:`MOVED_MODULES` answers those names with today's modules (``tests/core/test_old_models.py``; whole models
  logged at 43f75dd and a765a9c in ``tests/stages/test_score_legacy_models.py``);
- Transformers saved when two classes had one sigmoid unit (``tests/model/test_classifiers.py``; their ``[N, 1]``
  output becomes ``[1 - p, p]`` in ``pipeline.core.predictions.as_class_probabilities``).

Anything older is not supported: retrain it with ``make all``. Reads and writes nothing.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types

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


def install() -> None:
    """Answer the moved modules' old names (once per process; the package's ``__init__`` calls it)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
