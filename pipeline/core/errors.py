"""The mistakes a user can fix, as one exception family.

``python -m pipeline`` turns a :class:`PipelineError` into one ``error:`` line and exit status 2.
Anything else is a bug in this code or a library and keeps its traceback, a bare
``FileNotFoundError`` included: a user's missing file is raised as :class:`MissingInputError`. Each class
subclasses the built-in a caller would expect (``ValueError``, and
``FileNotFoundError`` for something that is not there), so ``except ValueError`` still works.
"""

from __future__ import annotations


class PipelineError(ValueError):
    """A mistake the user can fix; the message names the file, row, field or command."""


class ConfigError(PipelineError):
    """A setting that is not valid: a config file's key, a ``--set`` override or a command-line option (``--seeds``,
    ``--check-rows``, ...): unknown key, wrong type, bad value."""


class InputError(PipelineError):
    """Input data or a model that cannot be used: a corrupt archive, a bad table or CSV, a bad model URI."""


class MissingInputError(PipelineError, FileNotFoundError):
    """An input that is not there: a file, or the output of an upstream stage that has not run."""


def unreachable_tracking_server(error: BaseException) -> str | None:
    """The one line for a tracking server that did not answer (stopped, restarting, unreachable), found in ``error``
    or what caused it; None for any other error. MLflow has already retried by then
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``); what finished before is recorded, and a rerun goes on from it."""
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen)
        if type(seen).__name__ == "MlflowException" and "API request to " in text and " failed with exception " in text:
            url = text.split("API request to ", 1)[1].split(" ", 1)[0]
            server = url.split("/api/", 1)[0]
            reason = "connection refused" if "refused" in text.lower() else text.split(" failed with exception ", 1)[1]
            return (
                f"the MLflow tracking server {server} did not answer ({reason[:160]}): start it again (or point "
                "MLFLOW_TRACKING_URI at one that runs), then run the same command; what finished is kept"
            )
        seen = seen.__cause__ or seen.__context__
    return None
