"""The exported graph answers as ``make score`` does: the same probabilities (within :data:`TOLERANCE`), every
label and every ``score_error`` the same, on the texts given plus :data:`BAD_TEXTS`.

Texts reach the graph as UTF-8 bytes, a text Python holds with unpaired surrogates as the bytes a client holding it
would send (``surrogatepass``), which are not valid UTF-8.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from pipeline.core.predictions import from_probability_columns

TOLERANCE = 1e-5
BATCH = 256
# the rows every scorer refuses, one of each reason (pipeline.text.conventions.text_problem)
BAD_TEXTS = ("", "   \t\u3000", "42", " -1.5e3 ", "\u0661\u0662", "\ud800 an unpaired surrogate")


@dataclass(frozen=True)
class IdentityCheck:
    """What comparing the graph with the pyfunc model found."""

    rows: int
    scored_rows: int
    max_abs_difference: float  # over every class probability of every scored row
    differing_labels: int
    differing_errors: int
    graph_seconds: float  # the SavedModel's time for all rows, in batches of BATCH
    pyfunc_seconds: float  # the pyfunc model's (what make score runs), same batches

    @property
    def passed(self) -> bool:
        return self.max_abs_difference <= TOLERANCE and not self.differing_labels and not self.differing_errors

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"identity check {verdict} on {self.rows:,} rows ({self.scored_rows:,} scored): max |difference| "
            f"{self.max_abs_difference:.2e} (tolerance {TOLERANCE:g}), {self.differing_labels} labels and "
            f"{self.differing_errors} score_errors differ"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "tolerance": TOLERANCE}


def as_bytes(texts: Sequence[str]) -> list[bytes]:
    return [text.encode("utf-8", "surrogatepass") for text in texts]


def graph_frame(outputs: dict, labels: Sequence[str]) -> pd.DataFrame:
    """The graph's outputs as the pyfunc model's columns (probabilities, ``predicted_label``, ``score_error``)."""
    columns = {}
    if "positive_probability" in outputs:
        columns["positive_probability"] = outputs["positive_probability"].numpy().astype(np.float64)
    else:
        for index, label in enumerate(labels):
            columns[f"probability_{label}"] = outputs["probabilities"].numpy()[:, index].astype(np.float64)
    decode = np.vectorize(lambda value: value.decode("utf-8"), otypes=[object])
    columns["predicted_label"] = decode(outputs["predicted_label"].numpy())
    columns["score_error"] = decode(outputs["score_error"].numpy())
    return pd.DataFrame(columns)


def score_both(signature, classifier, texts: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, float, float]:
    """(graph frame, pyfunc frame, graph seconds, pyfunc seconds) for ``texts``, batch by batch."""
    import tensorflow as tf

    graph, reference, graph_seconds, pyfunc_seconds = [], [], 0.0, 0.0
    for start in range(0, len(texts), BATCH):
        batch = texts[start : start + BATCH]
        started = time.perf_counter()
        graph.append(graph_frame(signature(text=tf.constant(as_bytes(batch), dtype=tf.string)), classifier.labels))
        graph_seconds += time.perf_counter() - started
        started = time.perf_counter()
        reference.append(classifier.predict(None, pd.DataFrame({"text": pd.Series(batch, dtype=object)})))
        pyfunc_seconds += time.perf_counter() - started
    return (pd.concat(graph, ignore_index=True), pd.concat(reference, ignore_index=True), graph_seconds, pyfunc_seconds)


def identity_check(signature, classifier, texts: Sequence[str]) -> IdentityCheck:
    """Score ``texts`` and :data:`BAD_TEXTS` with the graph's ``signature`` and with ``classifier``; compare."""
    texts = [*texts, *BAD_TEXTS]
    graph, reference, graph_seconds, pyfunc_seconds = score_both(signature, classifier, texts)
    scored = (reference["score_error"] == "").to_numpy()
    both = scored & (graph["score_error"] == "").to_numpy()
    difference = np.abs(
        from_probability_columns(graph[both], classifier.labels)
        - from_probability_columns(reference[both], classifier.labels)
    )
    max_difference = float(difference.max()) if difference.size else 0.0
    if (both != scored).any():
        max_difference = float("inf")  # a row one side scored and the other refused
    return IdentityCheck(
        rows=len(texts),
        scored_rows=int(scored.sum()),
        max_abs_difference=max_difference,
        differing_labels=int((graph["predicted_label"] != reference["predicted_label"]).sum()),
        differing_errors=int((graph["score_error"] != reference["score_error"]).sum()),
        graph_seconds=graph_seconds,
        pyfunc_seconds=pyfunc_seconds,
    )
