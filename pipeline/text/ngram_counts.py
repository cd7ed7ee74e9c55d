"""Binary word n-gram counts of a fitted scikit-learn ``CountVectorizer``, the same matrix computed faster (pure, no
I/O): what the lexical models' scoring path (``pipeline.model.classifiers.LexicalClassifier``) counts with.
:class:`NgramVocabulary` is such a vectorizer as arrays (what ``pipeline.lexical.NbsvmArrays`` saves), which
:class:`NgramCounts` is built from without the vectorizer's pickled vocabulary dict."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import ConfigError


@dataclass(frozen=True, eq=False)
class NgramVocabulary:
    """A fitted word n-gram ``CountVectorizer`` as arrays: the distinct tokens its n-grams are made of, and each
    column's n-gram as the ids of its tokens (``-1`` after the n-gram's end), with the settings that count a text.

    Tokens never hold a space (the vectorizer joins an n-gram's tokens with one, and the tokens are read back by
    splitting on it), so ``features()`` gives back the vectorizer's feature names in column order."""

    tokens: tuple[str, ...]
    ngram_token_ids: np.ndarray  # [columns, longest n-gram], integer: column c is the n-gram of these tokens
    ngram_range: tuple[int, int]
    lowercase: bool
    token_pattern: str
    binary: bool
    dtype: str  # of the counts matrix: "float32"

    def __post_init__(self) -> None:
        low, high = self.ngram_range
        ids = self.ngram_token_ids
        if not 1 <= low <= high:
            raise ValueError(f"an n-gram range is 1 <= low <= high, got {self.ngram_range}")
        if ids.ndim != 2 or ids.shape[1] != high or ids.dtype.kind not in "iu":
            raise ValueError(
                f"ngram_token_ids must be integers of shape [columns, {high}], got {ids.dtype} {ids.shape}"
            )
        if ids.size and (ids.min() < -1 or ids.max() >= len(self.tokens)):
            raise ValueError(f"ngram_token_ids must lie in [-1, {len(self.tokens)}) (the tokens' ids)")
        held = ids >= 0
        lengths = held.sum(axis=1)
        if (held[:, 1:] > held[:, :-1]).any() or ((lengths < low) | (lengths > high)).any():
            raise ValueError(f"each column's n-gram must be {low} to {high} token ids, then -1s")
        if any(" " in token for token in self.tokens):
            raise ValueError("a token holds a space: the n-grams' tokens could not be told apart")

    @classmethod
    def from_vectorizer(cls, vectorizer) -> NgramVocabulary:
        """The arrays of a fitted word-analyzer ``CountVectorizer``; a ``ValueError`` for one whose counts
        :class:`NgramCounts` would not reproduce (other analyzers, accent stripping, stop words, custom steps)."""
        if (
            vectorizer.analyzer != "word"
            or vectorizer.input != "content"
            or vectorizer.strip_accents
            or vectorizer.stop_words
            or vectorizer.preprocessor
            or vectorizer.tokenizer
        ):
            raise ValueError(
                "NgramCounts mirrors a word-analyzer CountVectorizer without accent stripping, stop words or custom "
                "pre-processing"
            )
        low, high = (int(n) for n in vectorizer.ngram_range)
        tokens, ngram_token_ids = _token_table(vectorizer.vocabulary_, high)
        return cls(
            tokens,
            ngram_token_ids,
            (low, high),
            bool(vectorizer.lowercase),
            str(vectorizer.token_pattern),
            bool(vectorizer.binary),
            np.dtype(vectorizer.dtype).name,
        )

    @property
    def width(self) -> int:  # the columns of the counts matrix
        return len(self.ngram_token_ids)

    def lengths(self) -> np.ndarray:
        """Each column's n-gram length."""
        return (self.ngram_token_ids >= 0).sum(axis=1)

    def features(self) -> list[str]:
        """The n-grams in column order, as the vectorizer's ``get_feature_names_out()`` names them."""
        tokens = np.asarray(self.tokens, dtype=object)
        lengths = self.lengths()
        features = np.empty(self.width, dtype=object)
        for n in range(self.ngram_range[0], self.ngram_range[1] + 1):
            columns = np.flatnonzero(lengths == n)
            parts = tokens[self.ngram_token_ids[columns, :n]]
            joined = parts[:, 0]
            for position in range(1, n):
                joined = joined + " " + parts[:, position]
            features[columns] = joined
        return features.tolist()

    def settings(self) -> dict:
        """What counts a text, beside the arrays (JSON types)."""
        return {
            "ngram_range": list(self.ngram_range),
            "lowercase": self.lowercase,
            "token_pattern": self.token_pattern,
            "binary": self.binary,
            "dtype": self.dtype,
        }


def _token_table(vocabulary: dict[str, int], high: int) -> tuple[tuple[str, ...], np.ndarray]:
    """The distinct tokens of ``vocabulary``'s n-grams (first seen first) and its ``[columns, high]`` token ids.

    Every token of every n-gram is split out and looked up in loops that run in C (an 800,000-feature vocabulary
    in about half a second; a Python loop per n-gram takes several)."""
    features = list(vocabulary)
    table = np.full((len(features), high), -1, dtype=np.int32)
    if not features:
        return (), table
    lengths = np.fromiter((feature.count(" ") for feature in features), dtype=np.int64, count=len(features)) + 1
    every_token = " ".join(features).split(" ")
    token_ids = {token: index for index, token in enumerate(dict.fromkeys(every_token))}
    ids = np.fromiter(map(token_ids.__getitem__, every_token), dtype=np.int32, count=len(every_token))
    if lengths.max() > high:
        raise ValueError(f"the vocabulary holds an n-gram longer than its n-gram range's {high}")
    columns = np.fromiter(vocabulary.values(), dtype=np.int64, count=len(features))
    starts = np.cumsum(lengths) - lengths
    table[np.repeat(columns, lengths), np.arange(len(ids)) - np.repeat(starts, lengths)] = ids
    return tuple(token_ids), table


class NgramCounts:
    """A fitted word n-gram ``CountVectorizer``'s binary counts, the same matrix faster.

    scikit-learn builds every n-gram of a review as a string and looks each up in the vocabulary, in
    Python: at scoring time that is slower than the Transformer. Here each token is looked up once
    (its id among the tokens the vocabulary's n-grams are made of; an unknown token ends every n-gram
    through it, as it would in scikit-learn, where such an n-gram is never a feature), and the n-grams
    become integer keys matched against the vocabulary's in NumPy. Tokens never hold a space (the
    vectorizer joins an n-gram's tokens with one), so key and string stand for the same n-gram: the
    matrix is identical, which a test checks on texts of every kind.

    Built from the fitted vectorizer or from its :class:`NgramVocabulary` (the same counts, without the vocabulary
    dict: what a model saved as arrays loads).
    """

    def __init__(self, vocabulary) -> None:  # an NgramVocabulary or a fitted CountVectorizer
        if not isinstance(vocabulary, NgramVocabulary):
            vocabulary = NgramVocabulary.from_vectorizer(vocabulary)
        self.pattern = re.compile(vocabulary.token_pattern)
        self.lowercase = vocabulary.lowercase
        self.binary = vocabulary.binary
        self.dtype = np.dtype(vocabulary.dtype)
        self.orders = range(vocabulary.ngram_range[0], vocabulary.ngram_range[1] + 1)
        self.width = vocabulary.width
        self.token_ids: dict[str, int] = dict(zip(vocabulary.tokens, range(len(vocabulary.tokens))))
        self.base = max(1, len(self.token_ids))
        if self.base ** max(self.orders) >= 2**62:
            raise ConfigError(f"{self.base:,} tokens and {max(self.orders)}-grams do not fit 64-bit keys")
        lengths = vocabulary.lengths()
        self.keys, self.columns = {}, {}
        for n in self.orders:
            columns = np.flatnonzero(lengths == n)
            keys = self._keys(vocabulary.ngram_token_ids[columns, :n].astype(np.int64))
            order = np.argsort(keys)
            self.keys[n], self.columns[n] = keys[order], columns[order].astype(np.int64)
            if (self.keys[n][1:] == self.keys[n][:-1]).any():
                raise ValueError(f"the vocabulary holds a {n}-gram twice: its columns are not one vectorizer's")

    def _keys(self, grams: np.ndarray) -> np.ndarray:
        keys = np.zeros(len(grams), dtype=np.int64)
        for j in range(grams.shape[1]):
            keys = keys * self.base + grams[:, j]
        return keys

    def transform(self, texts: Sequence[str]):
        from scipy import sparse

        tokens = [self.pattern.findall(text.lower() if self.lowercase else text) for text in texts]
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        get = self.token_ids.get
        ids = np.fromiter((get(token, -1) for doc in tokens for token in doc), dtype=np.int64, count=int(lengths.sum()))
        doc = np.repeat(np.arange(len(tokens)), lengths)
        row_parts: list[np.ndarray] = []
        column_parts: list[np.ndarray] = []
        for n in self.orders:
            count = len(ids) - n + 1
            if count <= 0:
                continue
            grams = np.lib.stride_tricks.sliding_window_view(ids, n)
            usable = (doc[:count] == doc[n - 1 :]) & (grams >= 0).all(axis=1)
            keys = self._keys(grams[usable])
            position = np.minimum(np.searchsorted(self.keys[n], keys), max(len(self.keys[n]) - 1, 0))
            hit = (self.keys[n][position] == keys) if len(self.keys[n]) else np.zeros(len(keys), bool)
            row_parts.append(doc[:count][usable][hit])
            column_parts.append(self.columns[n][position[hit]])
        rows = np.concatenate(row_parts) if row_parts else np.zeros(0, np.int64)
        columns = np.concatenate(column_parts) if column_parts else np.zeros(0, np.int64)
        matrix = sparse.csr_matrix(
            (np.ones(len(rows), dtype=self.dtype), (rows, columns)), shape=(len(tokens), self.width), dtype=self.dtype
        )
        matrix.sum_duplicates()
        if self.binary:
            matrix.data[:] = 1
        matrix.sort_indices()
        return matrix
