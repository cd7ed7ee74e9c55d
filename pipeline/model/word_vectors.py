"""In-domain word vectors for the Transformer's token embedding: the CPU-sized form of pretraining.

gensim's word2vec (skip-gram with negative sampling) learns one vector per WordPiece token from the
token ids of the train split and the unlabeled reviews (never validation or test), in a minute or two
on two cores where masked-LM pretraining needs far longer. With ``model.token_embedding: word2vec``
the train stage starts the classifier's ``token_embedding`` from them (:func:`embedding_matrix`),
rescaled to the spread of Keras' default initialisation; tokens word2vec never saw keep random vectors.

The vectors are cached beside the train stage's runs (``data/train/word_vectors-<key>.npy``), keyed
on the tokenize stage's manifest and the settings below, so every seed and variant reuses them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pipeline.core.catalog import UNLABELED_IDS_FILE, ids_file
from pipeline.core.files import atomic_replace, manifest_hash, sha256_text
from pipeline.text.conventions import PAD_ID

WINDOW = 5
EPOCHS = 5
MIN_COUNT = 3
NEGATIVE = 5
DEFAULT_SCALE = 0.05  # Keras' default embedding initialiser: uniform in [-0.05, 0.05]


def token_sentences(ids: np.ndarray) -> list[list[str]]:
    """Each row's non-padding token ids as strings (word2vec's words), ``[CLS]`` included."""
    return [[str(token) for token in row[row != PAD_ID]] for row in np.asarray(ids)]


def learn_vectors(sentences: list[list[str]], dimension: int, seed: int, workers: int = 2) -> dict[int, np.ndarray]:
    """word2vec vectors of every token id that occurs at least ``MIN_COUNT`` times."""
    from gensim.models import Word2Vec

    model = Word2Vec(
        sentences=sentences,
        vector_size=dimension,
        window=WINDOW,
        min_count=MIN_COUNT,
        sg=1,
        negative=NEGATIVE,
        epochs=EPOCHS,
        workers=workers,
        seed=seed,
    )
    return {int(token): model.wv[token] for token in model.wv.index_to_key}


def embedding_matrix(vectors: dict[int, np.ndarray], vocabulary_size: int, dimension: int, seed: int) -> np.ndarray:
    """``[vocabulary_size, dimension]``: the learned vectors rescaled so their spread matches Keras' default
    initialisation (each learned value's standard deviation ``DEFAULT_SCALE / sqrt(3)``), random elsewhere."""
    rng = np.random.default_rng(seed)
    matrix = rng.uniform(-DEFAULT_SCALE, DEFAULT_SCALE, (vocabulary_size, dimension)).astype(np.float32)
    known = [token for token in vectors if 0 <= token < vocabulary_size and token != PAD_ID]
    if known:
        learned = np.stack([vectors[token] for token in known]).astype(np.float32)
        learned = learned - learned.mean(axis=0)
        learned = learned / max(float(learned.std()), 1e-12) * (DEFAULT_SCALE / np.sqrt(3))
        matrix[known] = learned
    return matrix


def cached_embedding(tokenize_dir: Path, cache_dir: Path, vocabulary_size: int, dimension: int, seed: int) -> Path:
    """The embedding matrix file for this tokenization and dimension, learned now unless cached."""
    key = sha256_text(f"{manifest_hash(tokenize_dir)}-{dimension}-{seed}-{WINDOW}-{EPOCHS}-{MIN_COUNT}-{NEGATIVE}")[:16]
    path = cache_dir / f"word_vectors-{key}.npy"
    if path.is_file():
        return path
    started = time.perf_counter()
    parts = [np.load(tokenize_dir / ids_file("train"), mmap_mode="r")]
    if (tokenize_dir / UNLABELED_IDS_FILE).is_file():
        parts.append(np.load(tokenize_dir / UNLABELED_IDS_FILE, mmap_mode="r"))
    sentences = [sentence for part in parts for sentence in token_sentences(part)]
    matrix = embedding_matrix(learn_vectors(sentences, dimension, seed), vocabulary_size, dimension, seed)

    def save(tmp: str) -> None:
        with open(tmp, "wb") as out:  # a file object: np.save would add .npy to a bare name
            np.save(out, matrix)

    atomic_replace(path, save)  # a temporary file per writer, renamed into place
    print(
        f"train: learned {dimension}-dimensional word2vec vectors of {vocabulary_size:,} tokens from "
        f"{len(sentences):,} reviews (train + unlabeled) in {time.perf_counter() - started:.0f}s; cached {path}"
    )
    return path
