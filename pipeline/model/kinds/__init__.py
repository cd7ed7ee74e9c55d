"""The kinds of model the pipeline trains, compares, logs and serves, one module each, and the registry that finds
them by name (KerasHub's ``models/bert/`` keeps one class per role, each owning its behaviour; scikit-learn's
estimators own ``fit`` and ``predict_proba``):

- ``transformer`` (:mod:`~pipeline.model.kinds.transformer_classifier`): the Transformer encoder, its own or a preset's;
- ``nbsvm`` (:mod:`~pipeline.model.kinds.nbsvm_classifier`): the NBSVM baseline;
- ``fusion`` (:mod:`~pipeline.model.kinds.fusion_classifier`): both in one artifact, a cascade included;
- ``reference`` (:mod:`~pipeline.model.kinds.reference_classifier`): the TF-IDF reference row, never deployed.

Each kind's class (a :class:`~pipeline.model.kinds.base.PipelineModel`) owns its loading, ``prepare`` and ``score``,
its explanations, its export graph, its model-card lines and how a comparison shows it. A new kind is one module and
one line in :data:`KINDS`; outside this folder no code compares a kind's name (``tests/test_layout.py``).
"""

from __future__ import annotations

from pipeline.core.errors import InputError
from pipeline.model.kinds.base import PipelineModel
from pipeline.model.kinds.fusion_classifier import FusedClassifier
from pipeline.model.kinds.nbsvm_classifier import LexicalClassifier
from pipeline.model.kinds.reference_classifier import FittedTextModel
from pipeline.model.kinds.transformer_classifier import SentimentClassifier
from pipeline.tracking import OLD_MODEL_KINDS

KINDS: dict[str, type[PipelineModel]] = {
    kind.kind: kind for kind in (SentimentClassifier, LexicalClassifier, FusedClassifier, FittedTextModel)
}


def kind_of(name: str) -> type[PipelineModel]:
    """The class of the kind called ``name`` (a name runs were tagged with before a rename too)."""
    name = OLD_MODEL_KINDS.get(name, name)
    if name not in KINDS:
        raise InputError(f"unknown kind of model {name!r} (known: {', '.join(KINDS)})")
    return KINDS[name]


def register_kind(kind: type[PipelineModel]) -> type[PipelineModel]:
    """Add ``kind`` to :data:`KINDS` under its ``kind`` name (a decorator; a name taken is an error)."""
    if kind.kind in KINDS and KINDS[kind.kind] is not kind:
        raise ValueError(f"a kind of model called {kind.kind!r} is already registered ({KINDS[kind.kind].__name__})")
    KINDS[kind.kind] = kind
    return kind
