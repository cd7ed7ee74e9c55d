"""In-domain word vectors for the token embedding: what word2vec learns, how it is scaled, and that training
starts from it."""

import numpy as np

from pipeline.model import word_vectors
from pipeline.text.conventions import PAD_ID


def test_sentences_are_the_rows_without_padding():
    ids = np.array([[2, 7, 8, 0, 0], [2, 9, 0, 0, 0]], dtype=np.int32)
    assert word_vectors.token_sentences(ids) == [["2", "7", "8"], ["2", "9"]]


def test_words_that_share_contexts_get_close_vectors():
    rng = np.random.default_rng(0)
    sentences = []
    for _ in range(400):  # 10 and 11 appear in the same contexts; 20 in others
        context = [str(x) for x in rng.integers(30, 40, 4)]
        sentences.append(context[:2] + [str(rng.choice([10, 11]))] + context[2:])
        sentences.append([str(x) for x in rng.integers(50, 60, 2)] + ["20"] + [str(x) for x in rng.integers(50, 60, 2)])
    vectors = word_vectors.learn_vectors(sentences, dimension=16, seed=0, workers=1)
    cosine = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    assert cosine(vectors[10], vectors[11]) > cosine(vectors[10], vectors[20])


def test_the_embedding_keeps_the_default_spread_and_random_rows_for_unseen_tokens():
    vectors = {5: np.full(8, 3.0), 6: np.full(8, -1.0), 7: np.arange(8.0)}
    matrix = word_vectors.embedding_matrix(vectors, vocabulary_size=20, dimension=8, seed=0)
    assert matrix.shape == (20, 8) and matrix.dtype == np.float32
    assert np.abs(matrix).max() <= 0.2
    learned = matrix[[5, 6, 7]]
    assert np.isclose(learned.std(), word_vectors.DEFAULT_SCALE / np.sqrt(3), rtol=1e-4)
    assert not np.allclose(matrix[PAD_ID], matrix[1]) and np.abs(matrix[10]).max() <= word_vectors.DEFAULT_SCALE


def test_training_with_word2vec_starts_from_the_cached_vectors(trained_run, tmp_path):
    import shutil

    from pipeline.core.catalog import stage_dir
    from pipeline.model.transformer import build_model
    from pipeline.stages.train import fit_and_log as train

    config, _ = trained_run
    shutil.copytree(config.data_dir / "tokenize", tmp_path / "data" / "tokenize")  # the fixture stays untouched
    config = config.replace(paths={"data_dir": str(tmp_path / "data")})
    tokenize_dir = config.data_dir / "tokenize"
    cache = tmp_path / "vectors"
    from pipeline.text.wordpiece import WordPieceTextTokenizer

    size = WordPieceTextTokenizer.load(tokenize_dir).vocabulary_size
    path = word_vectors.cached_embedding(tokenize_dir, cache, vocabulary_size=size, dimension=16, seed=0)
    assert word_vectors.cached_embedding(tokenize_dir, cache, size, 16, 0) == path  # cached, not learned again
    matrix = np.load(path)
    w2v = config.replace(model={"token_embedding": "word2vec"}, training={"epochs": 1})
    data = train.load_training_data(w2v, tokenize_dir, 1)
    hardware = train.prepare_hardware(w2v)
    model, _ = train.build_and_compile(w2v, data, hardware, tokenize_dir, None)
    stage_cache = word_vectors.cached_embedding(tokenize_dir, stage_dir(w2v, "train"), size, 16, 0)
    np.testing.assert_allclose(model.get_layer("token_embedding").embeddings.numpy(), np.load(stage_cache))
    np.testing.assert_allclose(np.load(stage_cache), matrix)
    random_start = build_model(config.model, data.text_tokenizer.vocabulary_size, 32, 2)
    assert not np.allclose(random_start.get_layer("token_embedding").embeddings.numpy(), matrix)
