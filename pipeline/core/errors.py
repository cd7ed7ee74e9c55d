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
