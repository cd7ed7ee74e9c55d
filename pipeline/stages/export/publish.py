"""Where an exported SavedModel goes besides ``data/export/``: the registered version (or run) it came from, the
model's MLflow run (its artifacts ``export/saved_model``), the version's tag and model card; the export's manifest.

Reads: the tracking store (the version behind a ``models:/`` URI). Writes: the artifacts and tag on MLflow, the
refreshed model card, ``data/export/manifest.json``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.catalog import SAVED_MODEL_DIR
from pipeline.core.errors import InputError
from pipeline.core.files import build_manifest, sha256_file, write_manifest


def model_source(model_uri: str) -> tuple[str | None, str | None, str | None]:
    """(run id, registered name, version) behind ``model_uri``; None where it has none (a folder has neither)."""
    import mlflow

    from pipeline.tracking import model_reference

    try:
        return model_reference(model_uri)
    except (ValueError, mlflow.exceptions.MlflowException) as error:
        raise InputError(
            f"--model {model_uri}: not a registered version (models:/NAME@ALIAS or models:/NAME/VERSION): "
            f"{str(error).splitlines()[0]}"
        ) from None


def publish(
    reports_dir: Path, saved_model: Path, run_id: str | None, name: str | None, version: str | None
) -> str | None:
    """Log the SavedModel on the model's run, tag the registered version with its URI and refresh the version's
    model card; returns the URI (None for a model folder, which has no run)."""
    if run_id is None:
        return None
    import mlflow

    from pipeline.stages.register.champion import refresh_model_card
    from pipeline.tracking import EXPORT_ARTIFACTS, VERSION_EXPORT_TAG

    client = mlflow.tracking.MlflowClient()
    client.log_artifacts(run_id, str(saved_model), EXPORT_ARTIFACTS)
    exported_uri = f"runs:/{run_id}/{EXPORT_ARTIFACTS}"
    if name is not None:
        if version is None:  # model_reference names both or neither
            raise ValueError(f"registered model {name!r} without a version")
        client.set_model_version_tag(name, version, VERSION_EXPORT_TAG, exported_uri)
        refresh_model_card(reports_dir, name, version)
    return exported_uri


def write_export_manifest(folder: Path, model_uri: str, check_rows: int | None) -> None:
    outputs = {
        str(path.relative_to(folder)): sha256_file(path)
        for path in sorted((folder / SAVED_MODEL_DIR).rglob("*"))
        if path.is_file()
    }
    write_manifest(
        folder, build_manifest("export", "", {"model": model_uri}, {"check_rows": check_rows}, outputs=outputs)
    )
