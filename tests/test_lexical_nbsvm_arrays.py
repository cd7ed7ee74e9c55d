"""NBSVM as arrays (``pipeline.lexical.NbsvmArrays``): save/load round trips, the joblib pipeline's probabilities bit
for bit, its explanation weights, and the errors of a file that is not one."""

import io
import json
import random
import re
import zipfile

import joblib
import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import InputError, MissingInputError
from pipeline.lexical import NbsvmArrays, nbsvm_baseline, nbsvm_weights, tfidf_baseline
from tests.conftest import make_review

UNSEEN = [
    "",
    "!!!",
    "zyzzyva quux superb",  # words the vectorizer never saw, beside one it did
    "Superb?! SUPERB superb film film film",
    "a\nfilm\tsuperb",
    "Straße café naïve ΔΩ",
]


def reviews(count: int, seed: int, classes: int) -> pd.DataFrame:
    rng = random.Random(seed)
    labels = [i % classes for i in range(count)]
    texts = [make_review(rng, label % 2) + (" third" * 3 if label == 2 else "") for label in labels]
    return pd.DataFrame({"text": texts, "label": labels})


@pytest.fixture(scope="module", params=[2, 3], ids=["2-classes", "3-classes"])
def fitted(request):
    """A fitted NBSVM pipeline of 2 or 3 classes and texts to score with it."""
    classes = request.param
    train, val = reviews(240, 0, classes), reviews(60, 1, classes)
    pipeline = nbsvm_baseline(train, val, c_values=(0.3,), max_features=3000).model
    return pipeline, reviews(80, 2, classes)["text"].tolist() + UNSEEN


def test_saved_arrays_load_back_equal(fitted, tmp_path):
    arrays = NbsvmArrays.from_pipeline(fitted[0])
    loaded = NbsvmArrays.load(arrays.save(tmp_path / "model" / "nbsvm.npz"))
    assert loaded.vocabulary.tokens == arrays.vocabulary.tokens and len(arrays.vocabulary.tokens) > 10
    assert loaded.vocabulary.settings() == arrays.vocabulary.settings()
    for name in ("ratios", "coefficients", "intercepts", "classes"):
        assert getattr(loaded, name).dtype == getattr(arrays, name).dtype
        np.testing.assert_array_equal(getattr(loaded, name), getattr(arrays, name))
    np.testing.assert_array_equal(loaded.vocabulary.ngram_token_ids, arrays.vocabulary.ngram_token_ids)
    assert [path.name for path in (tmp_path / "model").iterdir()] == ["nbsvm.npz"]  # no temporary file left behind


def test_loaded_arrays_give_the_pipeline_s_probabilities_bit_for_bit(fitted, tmp_path):
    pipeline, texts = fitted
    loaded = NbsvmArrays.load(NbsvmArrays.from_pipeline(pipeline).save(tmp_path / "nbsvm.npz"))
    expected, got = pipeline.predict_proba(texts), loaded.predict_proba(texts)
    assert got.dtype == expected.dtype and got.shape == (len(texts), len(pipeline.classes_))
    assert np.array_equal(got, expected)  # exactly: not allclose
    assert len(np.unique(expected[:, 0])) > len(texts) // 2  # probabilities that tell texts apart
    counts = pipeline.steps[0][1].transform(texts)
    np.testing.assert_array_equal(loaded.predict_proba_counts(counts), expected)
    # a change of one coefficient the first text reads by a billionth, which allclose accepts, is seen
    loaded.coefficients[0, counts[0].indices[0]] *= 1 + 1e-9
    changed = loaded.predict_proba(texts[:1])
    assert np.allclose(changed, expected[:1]) and not np.array_equal(changed, expected[:1])


def test_the_arrays_weights_are_the_pipeline_s_explanation_weights(fitted, tmp_path):
    pipeline = fitted[0]
    expected = nbsvm_weights(pipeline, "a test")
    got = NbsvmArrays.load(NbsvmArrays.from_pipeline(pipeline).save(tmp_path / "nbsvm.npz")).weights()
    assert got.features == expected.features and len(got.features) > 100
    assert got.lowercase == expected.lowercase and got.ngram_range == expected.ngram_range
    for name in ("weights", "intercepts", "classes"):
        assert getattr(got, name).dtype == getattr(expected, name).dtype
        assert getattr(got, name).shape == getattr(expected, name).shape
        assert np.array_equal(getattr(got, name), getattr(expected, name))


def test_a_model_other_than_nbsvm_has_no_arrays():
    train = reviews(40, 3, 2)
    with pytest.raises(InputError, match="not the pipeline's NBSVM"):
        NbsvmArrays.from_pipeline(tfidf_baseline(train, seed=0))


@pytest.fixture(scope="module")
def saved_bytes(tmp_path_factory):
    """The bytes of a saved two-class model."""
    pipeline = nbsvm_baseline(reviews(60, 4, 2), reviews(20, 5, 2), max_features=500).model
    return NbsvmArrays.from_pipeline(pipeline).save(tmp_path_factory.mktemp("arrays") / "nbsvm.npz").read_bytes()


def rewritten(saved: bytes, folder, header_change: dict):
    """A copy of ``saved`` whose header has ``header_change`` applied."""
    with np.load(io.BytesIO(saved)) as stored:
        members = {name: stored[name] for name in stored.files}
    members["header"] = np.array(json.dumps({**json.loads(str(members["header"])), **header_change}))
    path = folder / "changed.npz"
    np.savez(path, **members)
    return path


def named(path) -> str:
    """A pattern that matches ``path`` in an error message."""
    return re.escape(str(path))


def test_a_file_of_another_version_or_format_is_refused_by_name(saved_bytes, tmp_path):
    other_version = rewritten(saved_bytes, tmp_path, {"format_version": 2})
    with pytest.raises(InputError, match=rf"{named(other_version)}.*format version 2, this code reads version 1"):
        NbsvmArrays.load(other_version)
    other_format = rewritten(saved_bytes, tmp_path, {"format": "something-else"})
    with pytest.raises(InputError, match=rf"{named(other_format)} is not an NBSVM arrays file"):
        NbsvmArrays.load(other_format)
    wrong_count = rewritten(saved_bytes, tmp_path, {"tokens": 3})
    with pytest.raises(InputError, match=rf"{named(wrong_count)} holds damaged NBSVM arrays"):
        NbsvmArrays.load(wrong_count)


def test_a_damaged_missing_or_pickled_file_is_refused_by_name(saved_bytes, tmp_path):
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(saved_bytes[: len(saved_bytes) // 2])
    flipped = tmp_path / "flipped.npz"
    middle = len(saved_bytes) // 2
    flipped.write_bytes(saved_bytes[:middle] + bytes([saved_bytes[middle] ^ 0xFF]) + saved_bytes[middle + 1 :])
    pickled = tmp_path / "nbsvm.joblib"
    joblib.dump({"not": "arrays"}, pickled)  # a pickle is never unpickled: allow_pickle=False
    for path in (truncated, flipped, pickled):
        with pytest.raises(InputError, match=rf"{named(path)} is not a readable NBSVM arrays file"):
            NbsvmArrays.load(path)
    with pytest.raises(MissingInputError, match=named(tmp_path / "absent.npz")):
        NbsvmArrays.load(tmp_path / "absent.npz")
    assert zipfile.is_zipfile(tmp_path / "flipped.npz")  # damaged inside, not in its zip directory
