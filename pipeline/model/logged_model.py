"""How the pipeline's pyfunc models (``pipeline.model.classifiers``) are logged to MLflow: the package as code,
a signature with the request options, and the exact versions of this environment as requirements.

Reads nothing; writes the model under the active MLflow run (its artifact folder ``model/``).
"""

from __future__ import annotations

import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import mlflow
import pandas as pd

from pipeline.core.errors import PipelineError
from pipeline.model.explain import TOP_ITEMS

EXAMPLE_TEXTS = ("A wonderful, moving film.", "Dull and far too long.")  # a logged model's input example
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # pipeline/: its libraries travel with every logged model
# what loading and scoring a logged model never import (the stages import the libraries, never the reverse:
# tests/test_layout.py), left out of the package's copy that travels with it
CODE_LEFT_OUT = ("stages", "__main__.py", "__pycache__", "*.pyc")
# what a logged model imports to answer (the package travels with it as code), pinned when it is logged
MODEL_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-text",
    "keras",
    "keras-hub",
    "mlflow",
    "pandas",
    "numpy",
    "scikit-learn",
    "scipy",
    "joblib",
    "pyyaml",
)


def pinned_requirements(distributions: tuple[str, ...] = MODEL_DISTRIBUTIONS) -> list[str]:
    """``name==version`` of each distribution as installed in this process, the versions a model is logged with:
    ``mlflow models serve`` or ``build-docker`` with a virtualenv or conda environment then rebuilds those, not
    whatever is newest that day. A distribution that is not installed is an error naming it."""
    pins = []
    for name in distributions:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise PipelineError(f"cannot pin {name} for a logged model: it is not installed (`make setup`)") from None
    return pins


MODEL_PARAMS = {"explain": False, "explain_top": TOP_ITEMS}  # PipelineModel.predict's params and their defaults


def log_pipeline_model(python_model, artifacts: dict[str, str], example_texts=EXAMPLE_TEXTS) -> str:
    """Log one of the pipeline's pyfunc models (``pipeline.model.classifiers``) on the active run; returns its URI.

    The logged instance is empty: MLflow pickles it, and its parts are loaded from ``artifacts`` by
    ``load_context``. The package travels with it (``code_paths``), so the model loads without an install; its
    requirements are the exact versions of this environment (:func:`pinned_requirements`).
    """
    example = pd.DataFrame({"text": list(example_texts)})
    loaded = type(python_model).from_artifacts(artifacts)
    with tempfile.TemporaryDirectory() as folder:
        code = model_code(Path(folder))
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=python_model,
            artifacts=artifacts,
            code_paths=[str(code)],
            # the request options: mlflow models serve and spark_udf pass only the params the signature declares
            signature=mlflow.models.infer_signature(example, loaded.predict(None, example), params=MODEL_PARAMS),
            input_example=example,
            pip_requirements=pinned_requirements(),
        )
    return info.model_uri


def model_code(folder: Path) -> Path:
    """A copy of the package under ``folder`` with what a logged model needs to load and score: its libraries, not
    its stages (:data:`CODE_LEFT_OUT`)."""
    return Path(shutil.copytree(PACKAGE_DIR, folder / PACKAGE_DIR.name, ignore=shutil.ignore_patterns(*CODE_LEFT_OUT)))
