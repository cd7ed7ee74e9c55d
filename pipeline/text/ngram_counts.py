"""Binary word n-gram counts of a fitted scikit-learn ``CountVectorizer``, the same matrix computed faster (pure, no
I/O): what the lexical models' scoring path (``pipeline.model.classifiers.LexicalClassifier``) counts with."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from pipeline.core.errors import ConfigError


class NgramCounts:
    """A fitted word n-gram ``CountVectorizer``'s binary counts, the same matrix faster.

    scikit-learn builds every n-gram of a review as a string and looks each up in the vocabulary, in
    Python: at scoring time that is slower than the Transformer. Here each token is looked up once
    (its id among the tokens the vocabulary's n-grams are made of; an unknown token ends every n-gram
    through it, as it would in scikit-learn, where such an n-gram is never a feature), and the n-grams
    become integer keys matched against the vocabulary's in NumPy. Tokens never hold a space (the
    vectorizer joins an n-gram's tokens with one), so key and string stand for the same n-gram: the
    matrix is identical, which a test checks on texts of every kind.
    """

    def __init__(self, vectorizer):
        if vectorizer.analyzer != "word" or vectorizer.strip_accents or vectorizer.preprocessor or vectorizer.tokenizer:
            raise ValueError(
                "NgramCounts mirrors a word-analyzer CountVectorizer without accent stripping or custom pre-processing"
            )
        self.pattern = re.compile(vectorizer.token_pattern)
        self.lowercase = vectorizer.lowercase
        self.binary = vectorizer.binary
        self.dtype = vectorizer.dtype
        self.orders = range(vectorizer.ngram_range[0], vectorizer.ngram_range[1] + 1)
        self.width = len(vectorizer.vocabulary_)
        self.token_ids: dict[str, int] = {}
        by_order: dict[int, tuple[list, list]] = {n: ([], []) for n in self.orders}
        for feature, column in vectorizer.vocabulary_.items():
            parts = feature.split(" ")
            ids = [self.token_ids.setdefault(token, len(self.token_ids)) for token in parts]
            by_order[len(parts)][0].append(ids)
            by_order[len(parts)][1].append(column)
        self.base = max(1, len(self.token_ids))
        if self.base ** max(self.orders) >= 2**62:
            raise ConfigError(f"{self.base:,} tokens and {max(self.orders)}-grams do not fit 64-bit keys")
        self.keys, self.columns = {}, {}
        for n, (ids, columns) in by_order.items():
            keys = self._keys(np.asarray(ids, dtype=np.int64).reshape(-1, n)) if ids else np.zeros(0, np.int64)
            order = np.argsort(keys)
            self.keys[n], self.columns[n] = keys[order], np.asarray(columns, dtype=np.int64)[order]

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
