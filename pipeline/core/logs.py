"""What a stage shows: its own progress and summary, not third-party start-up noise.

On a machine without a GPU, TensorFlow's C++ side prints start-up lines at import and at its first
device query (``failed call to cuInit: ... UNKNOWN ERROR (303)``, ``Could not find cuda drivers``,
oneDNN and CPU-feature notices) that read like failures, and MLflow warns that the pyfunc model's
``predict`` has no type hints (the pipeline validates its input itself). :func:`quiet_third_party`
keeps them out of stage output; ``python -m pipeline -v`` or ``PIPELINE_VERBOSE=1`` shows them. MLflow's own
INFO and WARNING lines (creating the tracking store's tables, a new experiment, CloudPickle, validating the input
example) go to a log file instead (:func:`third_party_log`), and its artifact-download progress bars are off.
Errors are never hidden: when TensorFlow fails to start, what it printed is shown before the error.
Progress bars (Keras, tqdm) write through Python and are not touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings

VERBOSE_ENV = "PIPELINE_VERBOSE"
LOG_FILE_ENV = "PIPELINE_LOG_FILE"  # where third-party log lines go in a quiet run
LOGGED_THIRD_PARTIES = ("mlflow", "alembic")
KNOWN_WARNINGS = (  # (message regex, category): third-party warnings that say nothing a user can act on
    (r"(\x1b\[[0-9;]*m)?Add type hints to the `predict` method", UserWarning),  # MLflow colours its message
    (r".*`build\(\)` was called on layer", UserWarning),
    (r"Protobuf gencode version", UserWarning),
    (r"The structure of `inputs` doesn't match the expected structure", UserWarning),  # Keras, a dict-input model
    (r"`shuffle=True` was passed, but will be ignored", UserWarning),  # Keras: the dataset is shuffled already
    (r".* is experimental \(supported from v", Warning),  # Optuna's heartbeat API, used as documented
    (r"Argument ``heartbeat_interval`` is an experimental feature", Warning),  # the same, as Optuna 4 words it
)


def duration(seconds: float) -> str:
    """``seconds`` as a progress line says it: ``4m05s``, or ``1h02m`` from an hour on."""
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def verbose_requested(environ=os.environ) -> bool:
    return environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def captured_stderr():
    """Send file descriptor 2 (where C++ libraries log) to a temporary file; yields that file.

    On an exception inside the block, what was captured is written to the real stderr first.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield captured
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.buffer.write(captured.read())
            sys.stderr.flush()
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def is_known_warning(message, category) -> bool:
    return any(
        issubclass(category, known) and re.match(pattern, str(message), re.IGNORECASE)
        for pattern, known in KNOWN_WARNINGS
    )


def ignore_known_warnings() -> None:
    """Drop the warnings of :data:`KNOWN_WARNINGS`: as filters, and again where a warning is shown, because some
    libraries put their own filter first (MLflow's ``filter_user_warnings_once`` shows its type-hint notice
    "once" whatever filters the program set)."""
    for message, category in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    show = warnings.showwarning
    if getattr(show, "drops_known_warnings", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not is_known_warning(message, category):
            show(message, category, filename, lineno, file, line)

    showwarning.drops_known_warnings = True  # type: ignore[attr-defined]  # mypy has no function attributes
    warnings.showwarning = showwarning


def third_party_log(environ=os.environ) -> str:
    """The file a quiet run's third-party log lines go to: ``PIPELINE_LOG_FILE``, else ``pipeline_third_party.log``
    in the system's temporary folder."""
    return environ.get(LOG_FILE_ENV) or os.path.join(tempfile.gettempdir(), "pipeline_third_party.log")


class _ThirdPartyLogHandler(logging.FileHandler):
    """A file handler that records the file it writes (``pipeline_log_file``), so a second call keeps it."""

    pipeline_log_file: str


def log_third_parties_to_file(environ=os.environ) -> str:
    """MLflow's (and Alembic's) log lines to :func:`third_party_log` instead of the terminal; MLflow's
    artifact-download progress bars off (``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``, inherited by child processes).
    Returns the file."""
    environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow  # noqa: F401  (MLflow sets up its logger's terminal handler when imported: replaced here)

    path = third_party_log(environ)
    handler = _ThirdPartyLogHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in LOGGED_THIRD_PARTIES:
        logger = logging.getLogger(name)
        for old in [old for old in logger.handlers if getattr(old, "pipeline_log_file", None) != path]:
            logger.removeHandler(old)
        if not logger.handlers:
            handler.pipeline_log_file = path
            logger.addHandler(handler)
        logger.propagate = False
    return path


@contextlib.contextmanager
def printed_to_log(environ=os.environ):
    """What third parties *print* inside the block (MLflow's registry prints "Successfully registered model ..." and
    "Created version ..." to ``sys.stderr``, not through its logger) appended to :func:`third_party_log` instead of the
    terminal; shown as usual with ``VERBOSE=1``."""
    if verbose_requested(environ):
        yield
        return
    with (
        open(third_party_log(environ), "a", encoding="utf-8") as log,
        contextlib.redirect_stderr(log),
        contextlib.redirect_stdout(log),
    ):
        yield


def quiet_third_party(environ=os.environ, tensorflow: bool = True) -> None:
    """Drop the known third-party warnings, send MLflow's log lines to a file (:func:`log_third_parties_to_file`)
    and, with ``tensorflow``, start TensorFlow quietly (:func:`start_tensorflow_quietly`).

    Sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless the user set it (child processes inherit it).
    """
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    ignore_known_warnings()
    log_third_parties_to_file(environ)
    if tensorflow:
        start_tensorflow_quietly(environ)


def start_tensorflow_quietly(environ=os.environ) -> None:
    """Import TensorFlow and list its devices once inside :func:`captured_stderr`, so the C++ lines it prints only
    once per process go nowhere (shown with ``VERBOSE=1``); a no-op once TensorFlow is imported. A stage that may
    not need TensorFlow (scoring NBSVM) calls it where it loads a Keras model, and never pays its import (seconds)."""
    if verbose_requested(environ) or "tensorflow" in sys.modules:
        return
    with captured_stderr():
        try:
            import tensorflow as tf
        except ImportError:  # a machine without TensorFlow (Keras on JAX): nothing of it to quiet
            return
        tf.config.list_physical_devices()
