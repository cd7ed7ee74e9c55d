"""One prediction shape, models saved before it, and a scoring path free of ingestion and scikit-learn."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import InputError, MissingInputError
from pipeline.core.predictions import as_class_probabilities, predicted_and_confidence, probability_columns
from pipeline.model.classifiers import SentimentClassifier, output_columns, output_frame
from pipeline.text.conventions import text_problem
from tests.conftest import PROJECT_ROOT

LEGACY = PROJECT_ROOT / "tests" / "data" / "legacy_binary_model"


def test_legacy_sigmoid_output_becomes_two_class_probabilities():
    converted = as_class_probabilities(np.array([[0.2], [0.9]], dtype=np.float32))
    np.testing.assert_allclose(converted, [[0.8, 0.2], [0.1, 0.9]], rtol=1e-6)
    softmax = np.array([[0.1, 0.3, 0.6]], dtype=np.float32)
    np.testing.assert_array_equal(as_class_probabilities(softmax), softmax)
    with pytest.raises(ValueError, match=r"\[N, k\]"):
        as_class_probabilities(np.array([0.2, 0.9]))


def test_one_prediction_rule_for_two_and_more_classes():
    predicted, confidence = predicted_and_confidence(np.array([[0.3, 0.7], [0.6, 0.4], [0.5, 0.5]]))
    assert predicted.tolist() == [1, 0, 0] and confidence.tolist() == pytest.approx([0.7, 0.6, 0.5])
    predicted, confidence = predicted_and_confidence(np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]))
    assert predicted.tolist() == [1, 2] and confidence.tolist() == pytest.approx([0.5, 0.8])


def test_named_columns_only_at_the_edge():
    two = np.array([[0.3, 0.7]])
    assert list(probability_columns(two, ["negative", "positive"])) == ["positive_probability"]
    assert list(probability_columns(np.array([[0.2, 0.5, 0.3]]), ["a", "b", "c"])) == [
        "probability_a",
        "probability_b",
        "probability_c",
    ]
    frame = output_frame(two, ["negative", "positive"])
    assert frame.to_dict("records") == [
        {"positive_probability": pytest.approx(0.7), "predicted_label": "positive", "score_error": ""}
    ]
    assert output_columns(["neg", "pos"]) == ["positive_probability", "predicted_label", "score_error"]
    assert output_columns(["a", "b", "c"]) == [
        "probability_a",
        "probability_b",
        "probability_c",
        "predicted_label",
        "score_error",
    ]


def test_rows_with_an_error_keep_their_place_with_empty_scores():
    frame = output_frame(
        np.array([[0.3, 0.7], [0.9, 0.1]]), ["negative", "positive"], ["", "missing or empty text", ""]
    )
    assert frame["predicted_label"].tolist() == ["positive", "", "negative"]
    assert frame["score_error"].tolist() == ["", "missing or empty text", ""]
    assert frame["positive_probability"].iloc[[0, 2]].tolist() == pytest.approx([0.7, 0.1])
    assert frame["positive_probability"].iloc[1] is None  # null in JSON and Spark, an empty cell in CSV
    with pytest.raises(ValueError, match="2 probability rows for 1 scorable"):
        output_frame(np.array([[0.3, 0.7], [0.9, 0.1]]), ["negative", "positive"], ["", "empty"])


@pytest.mark.parametrize(
    "value, problem",
    [
        (None, "missing or empty text"),
        (float("nan"), "missing or empty text"),
        ("", "missing or empty text"),
        ("  \t", "whitespace-only text"),
        ("42", "not text (a number)"),
        (" -1.5e3 ", "not text (a number)"),
        (7, "not text (a int)"),
        (True, "not text (a bool)"),
        ("Loved it, 10/10", ""),
        ("7 Samurai", ""),
        ("caf\udce9 au lait", "not valid Unicode text (unpaired surrogate characters)"),
        ("café 😀", ""),
    ],
)
def test_one_rule_for_unscorable_values(value, problem):
    assert text_problem(value) == problem


def test_pyfunc_flags_unscorable_rows_and_scores_the_others(trained_run):
    _, run_dir = trained_run
    classifier = SentimentClassifier.from_paths(run_dir / "model.keras", run_dir / "tokenizer")
    texts = ["superb wonderful film", None, "   ", 12, "awful dull film", ""]
    frame = classifier.predict(None, pd.DataFrame({"text": texts}))
    assert frame["score_error"].tolist() == [
        "",
        "missing or empty text",
        "whitespace-only text",
        "not text (a int)",
        "",
        "missing or empty text",
    ]
    assert frame["predicted_label"].tolist()[1:4] == ["", "", ""]
    assert frame["positive_probability"].isna().tolist() == [False, True, True, True, False, True]
    alone = classifier.predict(None, pd.DataFrame({"text": ["superb wonderful film", "awful dull film"]}))
    assert frame["positive_probability"].iloc[[0, 4]].tolist() == pytest.approx(
        alone["positive_probability"].tolist(), abs=1e-6
    )


def test_model_saved_before_the_change_scores_the_same():
    """tests/data/legacy_binary_model was trained and saved by the pipeline when two classes had one sigmoid unit;
    expected.json holds what that code predicted."""
    expected = json.loads((LEGACY / "expected.json").read_text())
    classifier = SentimentClassifier.from_paths(LEGACY / "model.keras", LEGACY / "tokenizer")
    scored = classifier.predict(None, pd.DataFrame({"text": expected["texts"]}))
    np.testing.assert_allclose(scored["positive_probability"], expected["positive_probability"], atol=1e-6)
    labels = np.where(np.asarray(expected["positive_probability"]) >= 0.5, "positive", "negative")
    assert scored["predicted_label"].tolist() == labels.tolist()


def test_the_same_model_files_in_another_folder_load_once(tmp_path):
    """mlflow.pyfunc.load_model copies a logged model into a new folder on every call: the same files give the
    same loaded model (and its compiled forward passes); other files give another."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(LEGACY, copy)
    first = SentimentClassifier.from_paths(LEGACY / "model.keras", LEGACY / "tokenizer")
    second = SentimentClassifier.from_paths(copy / "model.keras", copy / "tokenizer")
    assert second.model is first.model and second.text_tokenizer is first.text_tokenizer
    (copy / "tokenizer" / "labels.json").write_text(json.dumps({"labels": ["bad", "good"]}))
    third = SentimentClassifier.from_paths(copy / "model.keras", copy / "tokenizer")
    assert third.labels == ["bad", "good"] and third.model is not first.model
    assert first.labels == ["negative", "positive"]


def test_a_lone_surrogate_anywhere_in_a_long_text_is_the_same_row_error(trained_run):
    """Scoring tokenizes only the ends of a long text; a surrogate in its middle must still be an error for that
    row (never a score, never an exception for the whole batch)."""
    _, run_dir = trained_run
    classifier = SentimentClassifier.from_paths(run_dir / "model.keras", run_dir / "tokenizer")
    texts = ["good film " * 300 + "\ud800" + " bad film" * 300, "a good film"]
    scored = classifier.predict(None, pd.DataFrame({"text": pd.Series(texts, dtype=object)}))  # Arrow cannot hold it
    assert scored["score_error"].tolist() == [text_problem(texts[0]), ""] and text_problem(texts[0])
    assert scored["positive_probability"].iloc[0] is None and scored["positive_probability"].iloc[1] is not None


def test_loading_from_several_threads_gives_one_model(tmp_path):
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    folders = []
    for index in range(4):
        shutil.copytree(LEGACY, tmp_path / str(index))
        folders.append(tmp_path / str(index))
    with ThreadPoolExecutor(max_workers=4) as pool:
        loaded = list(
            pool.map(lambda f: SentimentClassifier.from_paths(f / "model.keras", f / "tokenizer"), folders * 2)
        )
    assert len({id(classifier.model) for classifier in loaded}) == 1


def test_pyfunc_loads_from_its_logged_artifact_names():
    """MLflow calls load_context with the artifact names used by every model logged so far."""
    context = type(
        "Context",
        (),
        {"artifacts": {"keras_model": str(LEGACY / "model.keras"), "tokenizer": str(LEGACY / "tokenizer")}},
    )()
    classifier = SentimentClassifier()
    classifier.load_context(context)
    assert classifier.labels == ["negative", "positive"]
    assert SentimentClassifier.artifacts("m.keras", "tok") == {"keras_model": "m.keras", "tokenizer": "tok"}


def test_scoring_path_imports_no_ingestion_and_needs_no_sklearn():
    """Keras imports scikit-learn when it is installed, so the check blocks it: the pyfunc model must load
    and score without it, and without the ingestion, table, metrics or comparison modules."""
    script = f"""
import sys
class BlockSklearn:
    def find_spec(self, name, path=None, target=None):
        if name == "sklearn" or name.startswith("sklearn."):
            raise ImportError("scikit-learn is blocked in this test")
sys.meta_path.insert(0, BlockSklearn())
from pipeline.model.classifiers import SentimentClassifier
import pandas as pd
classifier = SentimentClassifier.from_paths({str(LEGACY / "model.keras")!r}, {str(LEGACY / "tokenizer")!r})
print(classifier.predict(None, pd.DataFrame({{"text": ["superb", "awful"]}}))["predicted_label"].tolist())
loaded = sorted(m for m in sys.modules if m.startswith(("sklearn", "pipeline.stages.ingest", "pipeline.metrics",
                                                         "pipeline.stages.compare")))
print("LOADED", loaded)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED []" in result.stdout


def test_a_wrong_shape_is_an_error_not_a_reshape():
    from pipeline.core.predictions import check_shape

    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        output_frame(np.array([0.2, 0.9]), ["negative", "positive"])
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        check_shape(np.zeros((4, 2)), 3)


def test_compiled_scoring_gives_the_eager_probabilities():
    from pipeline.model.classifiers import load_keras_model
    from pipeline.model.forward import predict_ids
    from pipeline.text.wordpiece import WordPieceTextTokenizer

    model = load_keras_model(LEGACY / "model.keras")
    encoder = WordPieceTextTokenizer.load(LEGACY / "tokenizer")
    rng = np.random.default_rng(0)
    words = ["superb", "awful", "the", "movie", "dull", "wonderful", "plot"]
    ids = encoder.encode([" ".join(rng.choice(words, rng.integers(1, 60))) for _ in range(300)])
    compiled = predict_ids(model, ids, batch_size=64, compiled=True)
    eager = predict_ids(model, ids, batch_size=64, compiled=False)
    np.testing.assert_allclose(compiled, eager, atol=1e-5)
    assert compiled.shape == (300, 2)


@pytest.fixture
def fresh_retracing_detector():
    """TensorFlow warns about retracing at most twice per traced Python function per process (its detector is
    keyed on the function's code, shared by every model's compiled forward pass): start each test from none."""
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    polymorphic_function._frequent_tracing_detector_manager._detectors.clear()


def test_one_trace_per_shape_is_not_reported_as_a_retracing_problem(fresh_retracing_detector):
    """Scoring compiles once per batch width by design; TensorFlow's retracing warning must not reach the user,
    while its other warnings still do."""
    import logging

    from pipeline.model.classifiers import load_keras_model
    from pipeline.model.forward import predict_ids

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        model = load_keras_model(LEGACY / "model.keras")
        width = 32  # the legacy model's sequence length
        ids = np.zeros((64, width), dtype=np.int32)
        ids[:, 0] = 2
        for row in range(64):  # rows of several lengths
            ids[row, 1 : 1 + row % width] = 7
        for rows in (1, 2, 3, 5, 9, 17, 33):  # small inputs: one batch padded to a power of two, a shape each
            predict_ids(model, ids[:rows], compiled=True)
        logger.warning("another tensorflow warning")
    finally:
        logger.removeHandler(handler)
    messages = [record.getMessage() for record in records]
    assert "another tensorflow warning" in messages
    assert not [m for m in messages if "retracing" in m]


def test_without_the_filter_the_same_calls_do_report_retracing(fresh_retracing_detector, monkeypatch):
    """The control of the test above: the shapes it scores do make TensorFlow warn when nothing filters it."""
    import logging

    from pipeline.model import classifiers, forward

    monkeypatch.setattr(forward, "_expected_retracing", lambda record: True)  # a filter that keeps everything
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    saved_filters = list(logger.filters)  # the real filter, added by an earlier model's compiled forward pass
    logger.filters[:] = []
    logger.addHandler(handler)
    try:
        model = classifiers.load_keras_model(LEGACY / "model.keras")  # a new model: its own compiled forward pass
        ids = np.zeros((64, 32), dtype=np.int32)
        ids[:, 0] = 2
        for row in range(64):
            ids[row, 1 : 1 + row % 32] = 7
        for rows in (1, 2, 3, 5, 9, 17, 33):
            forward.predict_ids(model, ids[:rows], compiled=True)
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = saved_filters
    assert [record for record in records if "retracing" in record.getMessage()]


def test_loading_a_logged_model_does_not_put_its_code_copy_on_sys_path(trained_run):
    """The logged model carries a copy of this package; in-process it must not shadow the real one."""
    import sys

    import mlflow

    from pipeline.model.classifiers import load_classifier

    config, run_dir = trained_run
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    run_id = json.loads((run_dir / "manifest.json").read_text())["mlflow_run_id"]
    before = list(sys.path)
    classifier = load_classifier(f"runs:/{run_id}/model")
    assert sys.path == before
    assert type(classifier) is SentimentClassifier  # today's class, not the copy's


def test_small_inputs_are_padded_to_a_power_of_two_and_score_like_eager():
    from pipeline.model.classifiers import load_keras_model
    from pipeline.model.forward import predict_ids
    from pipeline.text.wordpiece import WordPieceTextTokenizer

    model = load_keras_model(LEGACY / "model.keras")
    ids = WordPieceTextTokenizer.load(LEGACY / "tokenizer").encode(
        ["superb", "awful and dull", "the movie plot was fine"]
    )
    for rows in (1, 2, 3):
        np.testing.assert_allclose(
            predict_ids(model, ids[:rows], compiled=True), predict_ids(model, ids[:rows], compiled=False), atol=1e-5
        )


def test_a_shape_is_compiled_once_it_recurs_and_a_rare_one_runs_eagerly():
    """By default a batch shape met once or twice runs eagerly (no XLA compile for a few rows); met a third time,
    in one call or over several (a server), it is compiled, and the answers do not change."""
    from pipeline.model import classifiers, forward
    from pipeline.text.wordpiece import WordPieceTextTokenizer

    model = classifiers.load_keras_model(LEGACY / "model.keras")
    ids = WordPieceTextTokenizer.load(LEGACY / "tokenizer").encode(
        ["superb", "awful and dull", "the movie plot was fine"]
    )

    def traces() -> int:
        compiled = forward._COMPILED.get(model)
        return 0 if compiled is None else compiled.experimental_get_tracing_count()

    eager = forward.predict_ids(model, ids[:1], compiled=False)
    first, second = forward.predict_ids(model, ids[:1]), forward.predict_ids(model, ids[:1])
    assert traces() == 0  # twice the same one-row shape: eager both times
    third = forward.predict_ids(model, ids[:1])
    assert traces() == 1  # the third time: compiled
    forward.predict_ids(model, ids[:1])
    assert traces() == 1  # and reused
    for probabilities in (first, second, third):
        np.testing.assert_allclose(probabilities, eager, atol=1e-5)
    many = np.repeat(ids[1:2], 12, axis=0)  # one call with three batches of one shape compiles it at once
    np.testing.assert_allclose(
        forward.predict_ids(model, many, batch_size=4),
        forward.predict_ids(model, many, batch_size=4, compiled=False),
        atol=1e-5,
    )
    assert traces() == 2


def test_mlflows_type_hint_notice_for_our_pyfunc_models_is_a_known_warning():
    """MLflow shows its 'Add type hints' notice under a filter of its own ("once", put before ours), coloured:
    it must still not be shown. Shown warnings are collected where Python would print them."""
    import warnings

    import mlflow

    from pipeline.core.logs import ignore_known_warnings

    def shown(quiet: bool) -> list[str]:
        printed = []
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.showwarning = lambda message, *args, **kwargs: printed.append(str(message))
            if quiet:
                ignore_known_warnings()

            class Untyped(mlflow.pyfunc.PythonModel):
                def predict(self, context, model_input, params=None):
                    return model_input

            warnings.warn("a warning of our own", UserWarning, stacklevel=2)
        return printed

    assert any("type hints" in m for m in shown(quiet=False))  # the control: MLflow does show it
    assert shown(quiet=True) == ["a warning of our own"]  # and other warnings still are


def test_scoring_a_saved_model_eagerly_raises_no_keras_input_structure_warning(trained_run):
    """A model loaded from model.keras expects a list of its one input; the scoring path passes that, so a few rows
    scored eagerly print nothing. The control: the bare call Keras warns about."""
    import warnings

    from pipeline.model.classifiers import load_keras_model
    from pipeline.model.forward import predict_ids

    _, run_dir = trained_run
    model = load_keras_model(run_dir / "model.keras")
    ids = np.array([[2, 7, 8, 9, 0, 0], [2, 7, 0, 0, 0, 0]], dtype=np.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predict_ids(model, ids, compiled=False)
        predict_ids(model, ids[:1], compiled=True)
    assert not [w for w in caught if "structure of `inputs`" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(ids, training=False)
    assert [w for w in caught if "structure of `inputs`" in str(w.message)]


def test_pooling_windows_averages_log_probabilities_and_keeps_a_one_row_text_as_it_was():
    from pipeline.core.predictions import pool_windows

    rows = np.array([[0.2, 0.8], [0.9, 0.1], [0.6, 0.4], [0.3, 0.7]], dtype=np.float32)
    owner = np.array([0, 1, 1, 1])  # text 0: one row; text 1: its row and two windows
    pooled = pool_windows(rows, owner)
    assert pooled.shape == (2, 2) and pooled[0].tolist() == rows[0].tolist()
    logit = np.mean(np.log(rows[1:, 1]) - np.log(rows[1:, 0]))  # two classes: the mean logit
    assert pooled[1, 1] == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-6)
    assert pooled[1].sum() == pytest.approx(1.0, abs=1e-6)
    assert pool_windows(np.zeros((0, 2)), np.zeros(0, int)).shape == (0, 2)


def test_a_model_reading_windows_scores_a_long_review_whole_and_a_short_one_as_before(tmp_path):
    import shutil

    from pipeline.model.classifiers import SentimentClassifier
    from pipeline.model.forward import predict_ids
    from pipeline.text.wordpiece import WordPieceTextTokenizer

    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(LEGACY / "tokenizer", tokenizer)
    settings = json.loads((tokenizer / "tokenizer.json").read_text())
    (tokenizer / "tokenizer.json").write_text(json.dumps({**settings, "long_reviews": "windows"}))
    windows = SentimentClassifier.from_paths(LEGACY / "model.keras", tokenizer)
    truncate = SentimentClassifier.from_paths(LEGACY / "model.keras", LEGACY / "tokenizer")
    long = " ".join(["awful and dull"] * 30 + ["superb wonderful"] * 3 + ["awful"] * 20)  # its middle is cut
    texts = ["superb", long, "the movie plot was fine"]
    a, b = windows.probabilities(texts), truncate.probabilities(texts)
    np.testing.assert_array_equal(a[[0, 2]], b[[0, 2]])  # short reviews: the one row, as before
    ids, owner = WordPieceTextTokenizer.load(tokenizer).encode_windows([long])
    assert len(ids) > 2
    rows = predict_ids(windows.model, ids, compiled=False)
    logit = np.mean(np.log(rows[:, 1]) - np.log(rows[:, 0]))
    assert a[1, 1] == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-5) and abs(a[1, 1] - b[1, 1]) > 1e-4
    frame = windows.predict(None, pd.DataFrame({"text": texts}))  # the pyfunc answer: the same probabilities
    np.testing.assert_allclose(frame["positive_probability"].to_numpy(float), a[:, 1], atol=1e-6)


def test_a_model_reads_long_reviews_from_its_own_settings_and_an_old_one_from_its_tokenizer_file(tmp_path):
    from pipeline.model.classifiers import read_model_settings

    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(LEGACY / "tokenizer", tokenizer)
    assert read_model_settings({"tokenizer": str(tokenizer)}) == {"long_reviews": "truncate"}  # absent: truncate
    own = tmp_path / "model_settings.json"
    own.write_text(json.dumps({"long_reviews": "windows"}))
    assert read_model_settings({"tokenizer": str(tokenizer), "model_settings": str(own)}) == {"long_reviews": "windows"}
    settings = json.loads((tokenizer / "tokenizer.json").read_text())
    (tokenizer / "tokenizer.json").write_text(json.dumps({**settings, "long_reviews": "windows"}))  # logged before
    assert read_model_settings({"tokenizer": str(tokenizer)}) == {"long_reviews": "windows"}
    (tokenizer / "tokenizer.json").write_text(json.dumps({**settings, "long_reviews": "sliding"}))
    with pytest.raises(
        InputError, match=r"tokenizer/tokenizer.json: long_reviews is 'sliding', expected one of truncate"
    ):
        read_model_settings({"tokenizer": str(tokenizer)})
    with pytest.raises(MissingInputError, match=r"nowhere.json: the model.s settings are missing"):
        read_model_settings({"tokenizer": str(tokenizer), "model_settings": str(tmp_path / "nowhere.json")})
    own.write_text(json.dumps({"long_reviews": "whole"}))
    with pytest.raises(InputError, match=r"model_settings.json: long_reviews is 'whole'"):
        SentimentClassifier.from_paths(LEGACY / "model.keras", LEGACY / "tokenizer", own)
