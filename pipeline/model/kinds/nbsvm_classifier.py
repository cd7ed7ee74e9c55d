"""The NBSVM kind: a fitted scikit-learn (binary n-gram counts, naive-Bayes-scaled logistic regression) pipeline and
its class names. Texts get the same cleaning as at ingestion (``clean_text``) before the n-gram counts.

It owns its loading, scoring, exact per-n-gram explanations, its TensorFlow graph (a static lookup table of its
n-grams and its weights) and its model-card lines. scikit-learn and TensorFlow are imported when used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import joblib
import numpy as np

from pipeline.model.explain import Explanation, lexical_explanations
from pipeline.model.kinds.base import ARTIFACT_LABELS, ARTIFACT_LEXICAL_MODEL, PipelineModel
from pipeline.text.conventions import clean_text, load_labels
from pipeline.text.ngram_counts import NgramCounts

if TYPE_CHECKING:
    from pipeline.lexical import LexicalWeights, NbsvmArrays

ARRAYS_SUFFIX = ".npz"  # an NBSVM saved as arrays (``pipeline.core.catalog.LEXICAL_MODEL_FILE``); else a joblib pickle


class LexicalClassifier(PipelineModel):
    """NBSVM: its arrays (``nbsvm.npz``: ``pipeline.lexical.NbsvmArrays``, loaded in a fraction of a second, the
    fitted scikit-learn pipeline's answers bit for bit) and the class names; a model logged before the arrays holds
    the pickled pipeline (``nbsvm.joblib``), read as it was.

    Texts get the same cleaning as at ingestion (``clean_text``) before the n-gram counts.
    """

    kind: ClassVar[str] = "nbsvm"
    colour: ClassVar[str] = "tab:green"
    deploys_as: ClassVar[str] = "the NBSVM baseline alone"

    @staticmethod
    def artifacts(lexical_model: str | Path, labels_dir: str | Path) -> dict[str, str]:
        return {ARTIFACT_LEXICAL_MODEL: str(lexical_model), ARTIFACT_LABELS: str(labels_dir)}

    def _load(self, artifacts) -> None:
        path = Path(artifacts[ARTIFACT_LEXICAL_MODEL])
        self.labels = load_labels(Path(artifacts[ARTIFACT_LABELS]))
        self.arrays: NbsvmArrays | None = None
        self.lexical: Any = None  # the scikit-learn pipeline of a model logged before the arrays
        if path.suffix == ARRAYS_SUFFIX:
            from pipeline.lexical import NbsvmArrays

            self.arrays = NbsvmArrays.load(path)
            self.counts = self.arrays.ngram_counts
        else:
            self.lexical = joblib.load(path)
            self.counts = NgramCounts(self.lexical.steps[0][1])  # the fitted vectorizer's counts, computed faster

    def prepare(self, texts: Sequence[str]):
        return self.counts.transform([clean_text(text) for text in texts])  # the costly part, run ahead

    def score(self, prepared) -> np.ndarray:
        probabilities = np.zeros((prepared.shape[0], len(self.labels)), dtype=np.float32)
        if not prepared.shape[0]:
            return probabilities
        if self.arrays is not None:
            probabilities[:, self.arrays.classes] = self.arrays.predict_proba_counts(prepared)
        else:
            classifier = self.lexical.steps[-1][1]
            probabilities[:, np.asarray(classifier.classes_, dtype=int)] = classifier.predict_proba(prepared)
        return probabilities

    def weights(self, purpose: str) -> LexicalWeights:
        """Its n-grams and their weights (``purpose``: what asks, named in the error for a model that has none)."""
        if self.arrays is not None:
            return self.arrays.weights()
        from pipeline.lexical import nbsvm_weights  # scikit-learn: a pipeline logged before the arrays

        return nbsvm_weights(self.lexical, purpose)

    def explain(self, prepared, steps: int | None = None) -> list[Explanation]:
        return lexical_explanations(self, prepared)

    def part_explanations(self, texts: list[str]) -> list[tuple[str, list[Explanation]]]:
        return [("NBSVM", self.words(texts))]

    def words(self, texts: list[str]) -> list[Explanation]:
        """Each text's explanation with the words of its n-grams."""
        cleaned = [clean_text(text) for text in texts]
        return lexical_explanations(self, self.prepare(cleaned), cleaned)

    def graph(self, num_classes: int):
        lexical = lexical_module(self.weights("export's graph"), num_classes)
        return [lexical], lexical

    @classmethod
    def card_lines(cls, run, client) -> tuple[list[str], dict[str, str]]:
        return lexical_lines(run.data.params), run.data.params


def lexical_module(lexical: LexicalWeights, num_classes: int):
    """A ``tf.Module`` holding the NBSVM's lookup table and weights; calling it on cleaned texts gives float32
    ``[N, num_classes]`` probabilities, as ``LexicalClassifier`` does."""
    import tensorflow as tf

    class Lexical(tf.Module):
        def __init__(self):
            super().__init__(name="nbsvm")
            keys = tf.constant(lexical.features, dtype=tf.string)
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(lexical.features), dtype=tf.int64)), -1
            )
            self.weights = tf.Variable(lexical.weights, trainable=False, name="weights")
            self.intercepts = tf.Variable(lexical.intercepts, trainable=False, name="intercepts")

        def __call__(self, texts):
            if lexical.lowercase:
                texts = tf.strings.lower(texts, encoding="utf-8")
            # the token pattern: runs of word characters (Python's \w: letters, digits, "_"), and "!" and "?" alone
            texts = tf.strings.regex_replace(texts, r"[^\p{L}\p{N}_!?]+", " ")
            tokens = tf.strings.split(tf.strings.regex_replace(texts, r"([!?])", r" \1 "))
            low, high = lexical.ngram_range
            grams = tf.strings.ngrams(tokens, ngram_width=tuple(range(low, high + 1)), separator=" ")
            columns = self.table.lookup(grams)
            rows = tf.cast(columns.value_rowids(), tf.int64)
            found = columns.flat_values >= 0
            width = tf.constant(len(lexical.features), tf.int64)
            present, _ = tf.unique(tf.boolean_mask(rows * width + columns.flat_values, found))  # binary counts
            texts_count = tf.cast(columns.nrows(), tf.int64)
            logits = (
                tf.math.unsorted_segment_sum(tf.gather(self.weights, present % width), present // width, texts_count)
                + self.intercepts
            )
            scores = tf.sigmoid(logits)
            if len(lexical.classes) == 2:
                scores = tf.concat([1.0 - scores, scores], axis=1)
            else:
                scores = scores / tf.maximum(tf.reduce_sum(scores, axis=1, keepdims=True), 1e-12)
            scores = tf.cast(scores, tf.float32)  # LexicalClassifier stores float32, the absent classes 0
            return tf.transpose(
                tf.scatter_nd(lexical.classes[:, None], tf.transpose(scores), [num_classes, texts_count])
            )

    return Lexical()


def lexical_lines(params: dict, prefix: str = "") -> list[str]:
    get = params.get
    unlabeled_reviews = int(get("nbsvm.unlabeled_reviews") or 0)
    return [
        f"- {prefix}NBSVM: binary {get('nbsvm.ngram_range', '1,3').replace(',', '-')}-gram counts "
        f"({get('nbsvm.vocabulary')} n-grams), scaled by the naive-Bayes log-count ratio, liblinear logistic "
        f"regression with C={get('nbsvm.C')} (chosen on validation from {get('nbsvm.C_grid')}). It reads the "
        "whole review, however long."
        + (
            f" Trained on the reviews and {get('nbsvm.crops_per_review')} random 1-2-sentence crops of each, the "
            f"crops with soft labels ({get('nbsvm.crop_label_weight')} on the review's label, the rest a "
            "cross-fitted NBSVM's probability)."
            if int(get("nbsvm.crops_per_review") or 0)
            else ""
        )
        + (
            f" Also {get('nbsvm.unlabeled_crops_per_review')} crops of each of "
            f"{unlabeled_reviews:,} unlabeled reviews, each labelled with the class an NBSVM of "
            "the train reviews gives its whole review (mixed the same way with its probability on the crop)."
            if unlabeled_reviews
            else ""
        )
    ]
