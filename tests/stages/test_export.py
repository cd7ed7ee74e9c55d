"""make export: the graph answers as make score does, for every kind of model; the stage writes, logs and refuses as
it says; the SavedModel answers in a process that has TensorFlow and tensorflow-text only."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import ConfigError, InputError, PipelineError
from pipeline.core.predictions import lexical_confidence
from pipeline.text.conventions import text_problem
from pipeline.text.token_rows import pad_rows, window_offsets

TRICKY = [
    "Great<BR/>film, <br >loved it",
    "İstanbul ΣΑΣ ẞ straße!! ok?!",
    "e\u0301te\u0301 cafe\u0301",
    "\u00a0 padded \u2003",
    "x" * 300,
    "1st 2nd 3rd",
    "١٢ apples",
    "tab\there\r\nand 😀 emoji",
]


def sample_texts(config, rows: int = 60) -> list[str]:
    from pipeline.core.catalog import stage_dir
    from pipeline.stages.ingest.outputs import read_split

    texts = read_split(stage_dir(config, "ingest"), "test", columns=["text"])["text"].tolist()[:rows]
    return texts + TRICKY


def runs_of(kind: str, config) -> list:
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    return [
        run
        for run in mlflow.search_runs(search_all_experiments=True, output_format="list")
        if run.data.tags.get("model_kind") == kind
    ]


def exported(classifier, folder: Path):
    import tensorflow as tf

    from pipeline.stages.export.graph import SIGNATURE, write_saved_model

    write_saved_model(classifier, folder)
    return tf.saved_model.load(str(folder)).signatures[SIGNATURE]


@pytest.mark.parametrize(
    "kind",
    ["transformer", "nbsvm", "fusion", "fusion at 0.35", "fusion by length in a cascade", "transformer by windows"],
)
def test_the_graph_answers_as_make_score_does(comparison, tmp_path, kind):
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.check import BAD_TEXTS, identity_check

    config, _ = comparison
    run = runs_of(kind.split()[0], config)[0]
    classifier = load_classifier(f"runs:/{run.info.run_id}/model")
    texts = sample_texts(config)
    if kind == "fusion at 0.35":  # the tiny comparison's fusions chose weight 0; both parts must count
        classifier.weight = 0.35
    if kind == "fusion by length in a cascade":  # texts of at most 6 words (as str.split counts them) their own
        classifier.weight, classifier.short_weight, classifier.short_max_words = 0.35, 0.9, 6
        texts += [
            "Dull.",
            "A\u3000superb\u00a0film, truly",
            "one two three four five six",
            "one two three four five six seven",
            "  spaced\tout\n\nwords  ",
            "a<br />b c d e f",
        ]
        assert {0.35, 0.9} <= set(classifier.row_weights(texts).tolist())
        confidence = lexical_confidence(classifier.lexical.probabilities(texts))
        classifier.cascade_threshold = float(np.median(confidence))  # the Transformer reads about half the texts
        assert 0 < (confidence <= classifier.cascade_threshold).sum() < len(texts)
    if kind == "transformer by windows":
        classifier.settings = {"long_reviews": "windows"}
        assert classifier.reads_windows
        texts += [" ".join(texts[i : i + 6]) for i in range(0, 30, 6)]  # several times the 32-token limit
    check = identity_check(exported(classifier, tmp_path / "saved_model"), classifier, texts)
    assert check.passed, check.summary()
    assert check.rows == len(texts) + len(BAD_TEXTS) and check.scored_rows == len(texts)
    assert check.max_abs_difference < 1e-5 and check.differing_labels == 0 and check.differing_errors == 0


def test_the_check_fails_when_the_graph_answers_otherwise(comparison, tmp_path):
    """A control: the same check on a graph of another model fails."""
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.check import identity_check

    config, _ = comparison
    first, second = (load_classifier(f"runs:/{run.info.run_id}/model") for run in runs_of("transformer", config)[:2])
    check = identity_check(exported(first, tmp_path / "saved_model"), second, sample_texts(config))
    assert not check.passed and check.max_abs_difference > 1e-5


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.characters(codec=None), max_size=12)
        | st.sampled_from(
            ["", " ", "\u3000", "42", "-1.5e3", " \u0663\u0664 ", ".5", "5.", "1e", "+", "<br/>", "\ud800x"]
        ),
        max_size=8,
    )
)
def test_text_errors_and_cleaning_agree_with_python(texts):
    import tensorflow as tf

    from pipeline.stages.export.check import as_bytes
    from pipeline.text.conventions import clean_text
    from pipeline.text.graph_ops import clean_texts, text_errors

    batch = tf.constant(as_bytes(texts), dtype=tf.string)
    errors = [e.decode() for e in text_errors(batch).numpy()]
    assert errors == [text_problem(t) for t in texts]
    scorable = [t for t, e in zip(texts, errors) if not e]
    cleaned = [c.decode() for c in clean_texts(tf.constant(as_bytes(scorable), dtype=tf.string)).numpy()]
    assert cleaned == [clean_text(t) for t in scorable]


@pytest.mark.parametrize(
    "truncation,end_id", [("head", None), ("tail", None), ("head_tail", None), ("head_tail", 9), ("tail", 9)]
)
def test_padded_and_window_rows_agree_with_numpy(truncation, end_id):
    import tensorflow as tf

    from pipeline.text.graph_ops import padded_rows, window_rows

    rng = np.random.default_rng(4)
    lengths = rng.integers(0, 40, size=30)
    flat = rng.integers(5, 100, size=lengths.sum()).astype(np.int32)
    ragged = tf.RaggedTensor.from_row_lengths(flat, lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    expected = pad_rows(flat, starts, lengths, 12, truncation, 4, start_id=2, end_id=end_id)
    got = padded_rows(ragged, 12, truncation, 4, 2, end_id).numpy()
    width = got.shape[1]
    assert width == min(12, lengths.max() + (1 if end_id is None else 2))
    np.testing.assert_array_equal(got, expected[:, :width])
    assert not expected[:, width:].any()  # only padding was cut
    offsets, owners = window_offsets(lengths, 11)
    ids, owner = window_rows(ragged, 12, 2)
    np.testing.assert_array_equal(owner.numpy(), owners)
    np.testing.assert_array_equal(
        ids.numpy(), pad_rows(flat, starts[owners] + offsets, np.full(len(owners), 11), 12, "head", 0, start_id=2)
    )


def test_make_export_writes_logs_and_names_the_graph_and_keeps_the_last_one_on_failure(own_comparison, monkeypatch):
    from pipeline.stages import export, register
    from pipeline.stages.export import check
    from pipeline.tracking import EXPORT_ARTIFACTS, VERSION_EXPORT_TAG

    config, _ = own_comparison
    register.run(config)
    saved_model = export.run(config, check_rows=40)
    payload = json.loads((saved_model.parent / "export.json").read_text())
    assert payload["check"]["passed"] and payload["check"]["scored_rows"] == 40
    assert payload["model_uri"] == "models:/smoke-sentiment@champion" and payload["saved_model_bytes"] > 0
    client = mlflow.tracking.MlflowClient()
    version = client.get_model_version_by_alias("smoke-sentiment", "champion")
    assert version.tags[VERSION_EXPORT_TAG] == f"runs:/{version.run_id}/{EXPORT_ARTIFACTS}"
    assert any(a.path.endswith("saved_model.pb") for a in client.list_artifacts(version.run_id, EXPORT_ARTIFACTS))
    assert version.tags[VERSION_EXPORT_TAG] in client.get_model_version("smoke-sentiment", version.version).description
    assert (saved_model.parent / "manifest.json").is_file()
    before = (saved_model / "saved_model.pb").read_bytes()

    failing = check.IdentityCheck(
        rows=1,
        scored_rows=1,
        max_abs_difference=0.5,
        differing_labels=1,
        differing_errors=0,
        graph_seconds=0.0,
        pyfunc_seconds=0.0,
    )
    monkeypatch.setattr(check, "identity_check", lambda *args: failing)
    with pytest.raises(PipelineError, match="identity check FAILED"):
        export.run(config, check_rows=5)
    assert (saved_model / "saved_model.pb").read_bytes() == before
    assert not [p for p in saved_model.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    monkeypatch.undo()

    # the tracking store fails while the new graph is logged: the folder, export.json and the manifest all still
    # describe the previous export (its check of 40 rows), none the one that was never logged
    from pipeline.stages.export import publish

    def store_down(*args):
        raise mlflow.exceptions.MlflowException("tracking store unreachable")

    manifest_before = (saved_model.parent / "manifest.json").read_text()
    monkeypatch.setattr(publish, "publish", store_down)
    with pytest.raises(mlflow.exceptions.MlflowException, match="unreachable"):
        export.run(config, check_rows=5)
    assert json.loads((saved_model.parent / "export.json").read_text()) == payload
    assert (saved_model.parent / "manifest.json").read_text() == manifest_before
    assert (saved_model / "saved_model.pb").read_bytes() == before
    assert not [p for p in saved_model.parent.iterdir() if p.name.startswith(".")]
    with pytest.raises(InputError, match="not a registered version"):
        export.run(config, model_uri="models:/smoke-sentiment@no-such-alias", check_rows=5)
    with pytest.raises(ConfigError, match="--check-rows must be 0 or more"):
        export.run(config, check_rows=-1)


def tensorflow_only_site(folder: Path) -> Path:
    """A folder of links to tensorflow, tensorflow-text and what their own metadata requires, nothing else."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    site_packages = Path(metadata.distribution("tensorflow").locate_file(""))
    folder.mkdir()
    wanted, seen = ["tensorflow", "tensorflow-text"], set()
    while wanted:
        name = canonicalize_name(wanted.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for requirement in map(Requirement, distribution.requires or []):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
        for top in {Path(str(f)).parts[0] for f in distribution.files or [] if not str(f).startswith("..")}:
            if (site_packages / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(site_packages / top)
    return folder


def test_the_saved_model_answers_with_tensorflow_and_tensorflow_text_only(comparison, tmp_path):
    from pipeline.model.classifiers import load_classifier

    config, _ = comparison
    run = runs_of("fusion", config)[0]
    classifier = load_classifier(f"runs:/{run.info.run_id}/model")
    classifier.weight = 0.5
    exported(classifier, tmp_path / "saved_model")
    texts = ["A moving story, wonderfully acted.", "Dull, and far too long.", "   ", "42"]
    site = tensorflow_only_site(tmp_path / "site")
    script = f"""
import importlib.util, json, sys
sys.path[:0] = [{str(site)!r}]
present = [m for m in ("pipeline", "mlflow", "sklearn", "keras_hub", "pandas", "scipy") if importlib.util.find_spec(m)]
import tensorflow as tf
import tensorflow_text  # registers the ops the tokenizer uses
serve = tf.saved_model.load({str(tmp_path / "saved_model")!r}).signatures["serving_default"]
out = serve(text=tf.constant({texts!r}))
print(json.dumps({{"present": present, "probability": out["positive_probability"].numpy().tolist(),
                  "label": [v.decode() for v in out["predicted_label"].numpy()],
                  "error": [v.decode() for v in out["score_error"].numpy()]}}))
"""
    done = subprocess.run(
        [sys.executable, "-S", "-s", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["present"] == []
    expected = classifier.predict(None, pd.DataFrame({"text": texts}))
    assert answer["label"] == expected["predicted_label"].tolist()
    assert answer["error"] == expected["score_error"].tolist()
    np.testing.assert_allclose(answer["probability"][:2], expected["positive_probability"][:2].astype(float), atol=1e-5)
    assert all(p != p for p in answer["probability"][2:])  # NaN where the row was refused


def test_a_model_fine_tuned_from_a_real_checkpoint_exports_too(preset_comparison, tmp_path):
    """all-MiniLM-L6-v2's own tokenizer (start and end tokens) and encoder, in the graph; its checkpoint folder is
    gone (the fixture deletes it): the graph needs only the logged model."""
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.check import identity_check

    run = runs_of("transformer", preset_comparison)[0]
    classifier = load_classifier(f"runs:/{run.info.run_id}/model")
    assert classifier.text_tokenizer.preset is not None and classifier.text_tokenizer.end_id is not None
    texts = sample_texts(preset_comparison, 30)
    check = identity_check(exported(classifier, tmp_path / "saved_model"), classifier, texts)
    assert check.passed, check.summary()
