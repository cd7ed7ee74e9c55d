"""The old names logged models were pickled with load today's classes; a name nobody moved stays unknown."""

import importlib
import pickle

import pytest

from pipeline.core.old_models import MOVED_MODULES
from pipeline.lexical import NaiveBayesLogisticRegression
from pipeline.model.classifiers import SentimentClassifier


@pytest.mark.parametrize(
    ("old", "cls"),
    [("pipeline.inference", SentimentClassifier), ("pipeline.baseline", NaiveBayesLogisticRegression)],
)
def test_a_pickle_naming_a_moved_module_loads_todays_class(old, cls):
    assert getattr(importlib.import_module(MOVED_MODULES[old]), cls.__name__) is cls  # where it lives, or a re-export
    # a pickle's global reference, as a model logged before the move wrote it: GLOBAL 'module name' then STOP
    pickled = b"c" + old.encode() + b"\n" + cls.__name__.encode() + b"\n."
    assert pickle.loads(pickled) is cls


def test_a_module_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(b"cpipeline.no_such_module\nThing\n.")
