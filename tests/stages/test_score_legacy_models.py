"""Models logged before an upgrade keep answering the same: a user's registered champion survives it.

Two models logged by older code, each beside what that code answered (``*_expected.json``):

- ``legacy_pyfunc_model``: logged at 43f75dd, before the modules moved into ``pipeline/stages/``
  (``tests/data/legacy_pyfunc_model.md``);
- ``legacy_a765a9c_model``: logged at a765a9c, the stage layout with ``pipeline/encoder.py``
  (``tests/data/legacy_a765a9c_model.md``).

Both model folders, with the copies of the old package they carry, are one file, ``tests/data/legacy_models.tar.gz``,
unpacked once per test process (frozen sources are not loose files that every search of the tree finds). Which old
models must load, and the names that make them load, are in ``pipeline.core.old_models``.

Today's code must give the same rows through every client. In this process (``make score``, a registered
``@champion``) the pickled model and its artifacts are loaded by today's package, not by the copy of the package
each model carries in ``code/``; a fresh process that loads a model with MLflow alone (``mlflow models serve``)
runs that copy, which the control below shows.
"""

import atexit
import functools
import inspect
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from pipeline.model.classifiers import load_classifier
from pipeline.stages import score
from tests.conftest import PROJECT_ROOT
from tests.served_model import invoke, model_server

DATA = PROJECT_ROOT / "tests" / "data"
ARCHIVE = DATA / "legacy_models.tar.gz"
PACKAGE = (PROJECT_ROOT / "pipeline").resolve()
ANSWER_COLUMNS = ("positive_probability", "predicted_label", "score_error")


@dataclass(frozen=True)
class Legacy:
    """A model logged by older code and what that code answered for ``texts``."""

    folder: str  # its folder in ``ARCHIVE``
    expected: dict

    @property
    def path(self) -> Path:
        return unpacked() / self.folder

    @property
    def texts(self) -> list:
        return self.expected["texts"]

    @property
    def csv_texts(self) -> list[str]:
        return [text for text in self.texts if text is not None]  # a CSV cell cannot hold None

    def rows(self, texts=None) -> list[dict]:
        """The old code's answer rows for ``texts`` (default: all its texts, None included)."""
        if texts is None:
            return [{key: self.expected[key][i] for key in ANSWER_COLUMNS} for i in range(len(self.texts))]
        by_text = {text: i for i, text in enumerate(self.texts) if text is not None}
        return [{key: self.expected[key][by_text[text]] for key in ANSWER_COLUMNS} for text in texts]


@functools.cache
def unpacked() -> Path:
    """``ARCHIVE`` unpacked into a temporary folder of this process (once)."""
    folder = Path(tempfile.mkdtemp(prefix="legacy-models-"))
    atexit.register(shutil.rmtree, folder, True)
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(folder, filter="data")
    return folder


def legacy_model(folder: str, expected: str) -> Legacy:
    return Legacy(folder, json.loads((DATA / expected).read_text(encoding="utf-8")))


LEGACY = {
    "43f75dd": legacy_model("legacy_pyfunc_model", "legacy_pyfunc_expected.json"),
    "a765a9c": legacy_model("legacy_a765a9c_model", "legacy_a765a9c_expected.json"),
}


@pytest.fixture(params=sorted(LEGACY))
def legacy(request) -> Legacy:
    assert LEGACY[request.param].expected["logged_by_commit"] == request.param
    return LEGACY[request.param]


def assert_rows(got: list[dict], want: list[dict]) -> None:
    assert [row["score_error"] for row in got] == [row["score_error"] for row in want]
    assert [row["predicted_label"] for row in got] == [row["predicted_label"] for row in want]
    for have, expected in zip(got, want):
        if expected["positive_probability"] is None:
            assert have["positive_probability"] in (None, "")
        else:
            assert float(have["positive_probability"]) == pytest.approx(expected["positive_probability"], abs=1e-6)


def from_todays_package(source_file: str | Path) -> bool:
    """Whether a module's file is in this checkout's ``pipeline/`` (not in a model's ``code/pipeline/`` copy)."""
    return Path(source_file).resolve().is_relative_to(PACKAGE)


def pipeline_classes(classifier) -> list[type]:
    """The package's classes behind a loaded Transformer: the unpickled model, its tokenizer, its custom layers."""
    layers = {type(layer) for layer in classifier.model.layers if type(layer).__module__.split(".")[0] == "pipeline"}
    return [type(classifier), type(classifier.text_tokenizer), *sorted(layers, key=lambda cls: cls.__name__)]


def test_the_legacy_model_is_loaded_by_todays_package(legacy):
    """The pickled python model unpickles into today's class, and its artifacts (tokenizer, ``.keras`` file with
    custom layers) are read by today's code, although the model carries a copy of the old package."""
    assert (legacy.path / "code" / "pipeline" / "inference.py").is_file()  # a copy that could shadow today's
    classifier = load_classifier(str(legacy.path))
    classes = pipeline_classes(classifier)
    assert len(classes) >= 3, classes  # the model, its tokenizer and at least one custom layer: not a vacuous check
    assert [cls for cls in classes if not from_todays_package(inspect.getfile(cls))] == []
    assert not any(str(path).startswith(str(legacy.path)) for path in sys.path)  # the copy is off sys.path again
    answer = classifier.predict(None, pd.DataFrame({"text": legacy.texts}))
    assert_rows(answer.to_dict("records"), legacy.rows())


LOAD_WITH_MLFLOW_ALONE = """
import inspect, json, sys
import mlflow
model = mlflow.pyfunc.load_model(sys.argv[1]).unwrap_python_model()
classes = [type(model), type(model.encoder)] + [type(layer) for layer in model.model.layers]
print("FILES", json.dumps(sorted({inspect.getfile(c) for c in classes if c.__module__.split(".")[0] == "pipeline"})))
"""


def test_the_control_a_fresh_process_loading_it_with_mlflow_alone_runs_the_models_copy(legacy, tmp_path):
    """The check above fails where it should: today's package is importable here (PYTHONPATH), yet MLflow puts the
    model's ``code/`` first on ``sys.path``, so this process (as ``mlflow models serve`` does) runs the copy."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD_WITH_MLFLOW_ALONE, str(legacy.path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("FILES "))[6:])
    assert len(files) >= 3, files
    assert [file for file in files if from_todays_package(file)] == []
    assert all(Path(file).parent.name == "pipeline" and Path(file).parent.parent.name == "code" for file in files)


def test_make_score_answers_like_the_code_that_logged_it(legacy, smoke_config, tmp_path):
    pd.DataFrame({"text": legacy.csv_texts}).to_csv(tmp_path / "in.csv", index=False)
    score.run(smoke_config, tmp_path / "in.csv", tmp_path / "out.csv", model_uri=str(legacy.path))
    scored = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, dtype=str)
    assert scored["text"].tolist() == legacy.csv_texts
    assert_rows(scored.to_dict("records"), legacy.rows(legacy.csv_texts))


def test_a_registered_champion_logged_before_the_upgrade_is_still_the_default_model(legacy, smoke_config, tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'store.db'}"
    config = smoke_config.replace(tracking={"tracking_uri": tracking_uri})
    client = mlflow.tracking.MlflowClient(tracking_uri)
    name = config.tracking.registered_model_name
    client.create_registered_model(name)
    version = client.create_model_version(name, source=str(legacy.path))
    client.set_registered_model_alias(name, "champion", version.version)
    pd.DataFrame({"text": legacy.csv_texts}).to_csv(tmp_path / "in.csv", index=False)
    score.run(config, tmp_path / "in.csv", tmp_path / "out.csv")  # no model: the champion
    scored = pd.read_csv(tmp_path / "out.csv", keep_default_na=False, dtype=str)
    assert_rows(scored.to_dict("records"), legacy.rows(legacy.csv_texts))


def test_mlflow_models_serve_answers_like_the_code_that_logged_it(legacy, smoke_config):
    with model_server(str(legacy.path), f"sqlite:///{smoke_config.data_dir.parent / 'serve.db'}") as base:
        answer = invoke(base, [{"text": text} for text in legacy.texts])
    assert_rows(answer, legacy.rows())
