"""The model kinds (``pipeline.model.kinds``): one registry, and one fusion rule that the comparison's evaluation and
every client of a fused model follow, at the ends of the weight grid and every cascade share."""

import dataclasses
import json
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import InputError
from pipeline.core.predictions import FusionRule, cascade_probabilities, cascade_rows, fuse_probabilities
from pipeline.model.kinds import KINDS, kind_of
from pipeline.stages.compare.fusion_weights import EvaluatedRows, FusionChoice, PartScores, cascade
from pipeline.text.crops import word_counts

WEIGHTS = (0.0, 0.3, 1.0)  # the grid's ends and a middle weight
SHARES = (0.0, 0.1, 1.0)  # a cascade of its least sure validation row, of a tenth, of every row


def test_the_registry_finds_each_kind_by_name_and_an_old_name_and_refuses_an_unknown_one():
    assert set(KINDS) == {"transformer", "nbsvm", "fusion", "reference"}
    assert kind_of("lexical") is KINDS["nbsvm"]  # the name runs were tagged with before the rename
    assert [kind_of(name).deployable for name in KINDS] == [True, True, True, False]
    with pytest.raises(InputError, match="unknown kind of model 'svm'"):
        kind_of("svm")


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("weight", WEIGHTS)
def test_the_rule_answers_as_the_evaluation_fuses_then_cascades(classes, weight):
    """The pyfunc's path (the parts it runs, the rows it routes) against the evaluation's (fuse every row, then keep
    NBSVM's answer off the routed rows), with the parts a weight of 0 or 1 leaves out not given."""
    rng = np.random.default_rng(classes)
    transformer = rng.dirichlet(np.ones(classes), 50).astype(np.float32)
    lexical = rng.dirichlet(np.ones(classes) * 0.3, 50).astype(np.float32)
    for threshold in (None, float(np.quantile(lexical.max(axis=1), 0.4)), 0.0):
        rule = FusionRule(weight, weight, 0, threshold)
        weights = rule.row_weights(50)
        read = cascade_rows(lexical, threshold)
        evaluation = cascade_probabilities(fuse_probabilities(transformer, lexical, weight), lexical, read)
        routed = rule.routed(lexical)
        given_transformer = transformer if routed is None else transformer[routed]
        answer = rule.answer(
            given_transformer if rule.runs_transformer else None,
            lexical if rule.runs_lexical else None,
            weights,
            routed,
        )
        np.testing.assert_allclose(answer, evaluation, atol=1e-6)
        assert (answer.argmax(axis=1) == evaluation.argmax(axis=1)).all()
        if threshold is not None:
            assert rule.runs_lexical  # a cascade routes on NBSVM, whatever the weight


def test_a_fusion_weight_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="weight must be in"):
        FusionRule(1.5, 1.5)


@pytest.fixture(scope="module")
def fused_parts(comparison):
    """A fused model of the shared comparison, the test and validation texts, and its parts' probabilities on them."""
    from pipeline.model.classifiers import load_classifier

    config, _ = comparison
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    payload = json.loads((config.reports_dir / "comparison.json").read_text())
    run_id = payload["summary"]["nbsvm+mean"]["run_ids"][0]
    fused = load_classifier(f"runs:/{run_id}/model")
    data = config.data_dir / "ingest"
    test, val = pd.read_parquet(data / "test.parquet"), pd.read_parquet(data / "val.parquet")
    parts = {
        split: (frame["text"].tolist(), fused.transformer.probabilities(frame["text"].tolist()),
                fused.lexical.probabilities(frame["text"].tolist()), frame["label"].to_numpy())
        for split, frame in (("test", test), ("val", val))
    }  # fmt: skip
    return config, run_id, fused, parts


def evaluated(parts, weight: float, share: float) -> tuple[np.ndarray, float | None]:
    """The comparison's answers on the test texts for a fusion at ``weight`` cascaded at ``share`` (1: no cascade),
    through its own functions (``fusion_weights.cascade``), and the threshold it would ship."""
    (_, t_val, x_val, labels), (texts, t_test, x_test, _) = parts["val"], parts["test"]
    rows = EvaluatedRows(labels, word_counts(parts["val"][0]), word_counts(texts), {}, np.zeros(0), np.zeros(0))
    choice = FusionChoice(
        weight, weight, 0, {weight: 0.0}, 0.0, np.zeros(len(labels), dtype=bool),
        fuse_probabilities(t_val, x_val, weight), fuse_probabilities(t_test, x_test, weight), {},
    )  # fmt: skip
    if share >= 1:
        return choice.test, None
    lexical = PartScores(x_val, x_test, {})
    cascaded = cascade(choice, lexical, rows, share)
    return cascaded.choice.test, cascaded.threshold


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("weight", WEIGHTS)
def test_a_fused_model_answers_as_its_evaluation_at_every_weight_and_share(fused_parts, weight, share):
    """The rule b9c9e98 broke: at weight 1.0 with a cascade the model skipped NBSVM and with it the routing, so it
    answered with the Transformer on rows where the evaluation (whose figures chose it) kept NBSVM's answer."""
    _, _, fused, parts = fused_parts
    texts, _, lexical, _ = parts["test"]
    expected, threshold = evaluated(parts, weight, share)
    fused.weight = fused.short_weight = weight
    fused.cascade_threshold = threshold
    np.testing.assert_allclose(fused.probabilities(texts), expected, atol=1e-6)
    np.testing.assert_allclose(fused.probabilities(texts[:1]), expected[:1], atol=1e-6)  # one row
    if threshold is not None:
        kept = np.flatnonzero(~cascade_rows(lexical, threshold))
        if len(kept):  # a batch where nothing is routed: NBSVM's answers, the Transformer not run
            read = []
            original = fused.transformer.prepare
            fused.transformer.prepare = lambda batch: read.extend(batch) or original(batch)
            try:
                got = fused.probabilities([texts[i] for i in kept])
            finally:
                fused.transformer.prepare = original
            assert read == []
            np.testing.assert_array_equal(got, lexical[kept])


def grid_model(run_id: str, folder: Path, weight: float, threshold: float | None) -> Path:
    """A copy of the logged fused model ``run_id`` whose ``fusion.json`` holds ``weight`` and ``threshold``: a model
    folder every client loads (``MODEL=folder``)."""
    source = Path(mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model"))
    shutil.copytree(source, folder)
    (settings_file,) = folder.rglob("fusion.json")
    settings = json.loads(settings_file.read_text())
    settings.update(transformer_weight=weight, short_transformer_weight=weight, cascade_threshold=threshold)
    settings_file.write_text(json.dumps(settings))
    return folder


@pytest.mark.parametrize("weight", [1.0, 0.3])
def test_make_score_and_serve_give_the_evaluations_answers_for_a_cascade(fused_parts, weight, tmp_path):
    """The fused model served as a user gets it (a model folder: `make score`, `make serve`): the evaluation's labels
    and probabilities on the same rows, within 1e-6."""
    from pipeline.stages import score
    from tests.served_model import invoke, model_server

    config, run_id, _, parts = fused_parts
    texts = parts["test"][0]
    expected, threshold = evaluated(parts, weight, 0.1)
    model = grid_model(run_id, tmp_path / "model", weight, threshold)
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "in.csv", index=False)
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=str(model))
    scored = pd.read_csv(tmp_path / "out.csv")
    np.testing.assert_allclose(scored["positive_probability"], expected[:, 1], atol=1e-6)
    if weight == 1.0:  # a server start costs seconds: the weight b9c9e98 served wrong
        with model_server(str(model), config.tracking.tracking_uri) as base:
            served = invoke(base, [{"text": text} for text in texts[:40]])
        np.testing.assert_allclose([row["positive_probability"] for row in served], expected[:40, 1], atol=1e-6)
        assert [row["predicted_label"] for row in served] == scored["predicted_label"].tolist()[:40]


def test_the_export_graph_gives_the_evaluations_answers_for_a_cascade_at_weight_one(fused_parts, tmp_path):
    """The TensorFlow export of a weight-1 cascade: the evaluation's answers within the export check's tolerance."""
    import tensorflow as tf

    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.check import TOLERANCE
    from pipeline.stages.export.graph import SIGNATURE, write_saved_model

    _, run_id, _, parts = fused_parts
    texts = parts["test"][0]
    expected, threshold = evaluated(parts, 1.0, 0.1)
    model = load_classifier(str(grid_model(run_id, tmp_path / "model", 1.0, threshold)))
    exported = tf.saved_model.load(str(write_saved_model(model, tmp_path / "saved_model")))
    got = exported.signatures[SIGNATURE](text=tf.constant(texts))["positive_probability"].numpy()
    np.testing.assert_allclose(got, expected[:, 1], atol=TOLERANCE)
    assert dataclasses.is_dataclass(model.rule) and model.rule.runs_lexical


def test_a_toy_kind_is_one_module_and_one_registry_line_and_every_client_serves_it(smoke_config, tmp_path, monkeypatch):
    """A new kind (``tests/model/toy_kind.py``) and its line in the registry: logged like every kind, it scores and
    explains through `make score` and `make serve`, exports to a SavedModel and writes its model card's lines."""
    import cloudpickle
    import tensorflow as tf

    from pipeline.core.files import atomic_write_json
    from pipeline.model.logged_model import log_pipeline_model
    from pipeline.stages import score
    from pipeline.stages.export.graph import SIGNATURE, write_saved_model
    from pipeline.stages.register.card import model_lines
    from pipeline.tracking import MODEL_KIND_TAG, setup_tracking
    from tests.model import toy_kind
    from tests.model.toy_kind import GoodWordModel
    from tests.served_model import invoke, model_server

    monkeypatch.setitem(KINDS, GoodWordModel.kind, GoodWordModel)  # the registry line
    assert kind_of("toy") is GoodWordModel and kind_of("toy").deployable
    atomic_write_json(tmp_path / "labels" / "labels.json", {"labels": ["negative", "positive"]})
    setup_tracking(smoke_config.tracking)
    cloudpickle.register_pickle_by_value(toy_kind)  # the server's process cannot import the tests' modules
    try:
        with mlflow.start_run() as run:
            mlflow.set_tag(MODEL_KIND_TAG, "toy")
            mlflow.log_param("toy.word", "good")
            uri = log_pipeline_model(GoodWordModel(), GoodWordModel.artifacts(tmp_path / "labels"))
    finally:
        cloudpickle.unregister_pickle_by_value(toy_kind)
    texts = ["good good film", "a bad one", "good", "   "]
    expected = GoodWordModel.from_artifacts(GoodWordModel.artifacts(tmp_path / "labels")).probabilities(texts[:3])
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "in.csv", index=False)
    score.run(smoke_config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=uri, explain_top=1)
    scored = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    np.testing.assert_allclose(scored["positive_probability"][:3].astype(float), expected[:, 1], atol=1e-6)
    assert scored["predicted_label"].tolist() == ["positive", "negative", "positive", ""]
    assert scored["explanation"].tolist() == ["+good", "", "+good", ""] and scored["score_error"][3] != ""
    with model_server(uri, mlflow.get_tracking_uri()) as base:
        served = invoke(base, [{"text": text} for text in texts[:3]])
    np.testing.assert_allclose([row["positive_probability"] for row in served], expected[:, 1], atol=1e-6)
    exported = tf.saved_model.load(str(write_saved_model(load_classifier_of(uri), tmp_path / "saved_model")))
    got = exported.signatures[SIGNATURE](text=tf.constant(texts[:3]))["positive_probability"].numpy()
    np.testing.assert_allclose(got, expected[:, 1], atol=1e-5)
    kind, lines, _ = model_lines(mlflow.get_run(run.info.run_id), mlflow.tracking.MlflowClient())
    assert kind == "toy" and lines == ["- A toy model: it counts the word 'good' (good)."]


def load_classifier_of(uri: str):
    from pipeline.model.classifiers import load_classifier

    return load_classifier(uri)
