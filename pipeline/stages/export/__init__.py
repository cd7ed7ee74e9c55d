"""``make export``: a model (default the champion) as one TensorFlow SavedModel, raw text in, probability out.

Reads:  a model (``models:/<registered name>@champion`` by default, any ``models:/``, ``runs:/`` or model folder)
        and ingest's test split, for the identity check.
Writes: ``data/export/saved_model/`` (signature ``serving_default``: ``text: string[N]`` ->
        ``positive_probability`` (``probabilities`` for more classes), ``predicted_label``, ``score_error``),
        ``data/export/export.json`` (the model, the signature, the size, the check) and a manifest. On MLflow: the
        SavedModel as artifacts of the model's run (``export/saved_model``), its URI as the registered version's tag
        ``saved_model``, named in the version's model card.

Nothing is written unless the graph gives ``make score``'s answers on the test split (``pipeline.stages.export.check``);
a previous export stays until a new one has passed. The graph's parts are in ``graph`` and ``text_ops``.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.config import Config
from pipeline.core.catalog import EXPORT_SETTINGS_FILE, SAVED_MODEL_DIR, require_output, stage_dir
from pipeline.core.errors import InputError, PipelineError

DEFAULT_CHECK_ROWS = None  # every test review


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def model_source(model_uri: str) -> tuple[str | None, str | None, str | None]:
    """(run id, registered name, version) behind ``model_uri``; None where it has none (a folder has neither)."""
    import mlflow

    client = mlflow.tracking.MlflowClient()
    if model_uri.startswith("runs:/"):
        return model_uri.removeprefix("runs:/").split("/")[0], None, None
    if not model_uri.startswith("models:/"):
        return None, None, None
    reference = model_uri.removeprefix("models:/")
    try:
        if "@" in reference:
            name, alias = reference.split("@", 1)
            version = client.get_model_version_by_alias(name, alias)
        else:
            name, number = reference.split("/", 1)
            version = client.get_model_version(name, number)
    except (ValueError, mlflow.exceptions.MlflowException) as error:
        raise InputError(f"--model {model_uri}: not a registered version (models:/NAME@ALIAS or models:/NAME/VERSION): "
                         f"{str(error).splitlines()[0]}") from None
    return version.run_id, name, str(version.version)


def run(config: Config, model_uri: str | None = None, check_rows: int | None = DEFAULT_CHECK_ROWS) -> Path:
    """Export ``model_uri`` (default the champion) into ``data/export/``; returns the SavedModel's folder."""
    import tensorflow as tf

    from pipeline.core.files import atomic_write_json, staged_directory
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.check import identity_check
    from pipeline.stages.export.graph import INPUT, SIGNATURE, write_saved_model
    from pipeline.stages.ingest.outputs import read_split
    from pipeline.tracking import champion_uri, setup_tracking

    if check_rows is not None and check_rows < 0:
        raise InputError(f"--check-rows must be 0 or more (the test reviews to check), got {check_rows}")
    started = time.perf_counter()
    setup_tracking(config.tracking)
    model_uri = model_uri or champion_uri(config.tracking)
    texts = read_split(require_output(config, "ingest"), "test", columns=["text"])["text"].tolist()[:check_rows]
    run_id, name, version = model_source(model_uri)
    classifier = load_classifier(model_uri)
    folder = stage_dir(config, "export")
    with staged_directory(folder / SAVED_MODEL_DIR) as staging:
        write_saved_model(classifier, staging)
        check = identity_check(tf.saved_model.load(str(staging)).signatures[SIGNATURE], classifier, texts)
        if not check.passed:
            raise PipelineError(f"export: {check.summary()}; nothing written (a previous export is kept)")
    size = folder_bytes(folder / SAVED_MODEL_DIR)
    exported_uri = publish(config.reports_dir, folder / SAVED_MODEL_DIR, run_id, name, version)
    atomic_write_json(folder / EXPORT_SETTINGS_FILE, {
        "model_uri": model_uri, "run_id": run_id, "registered_model": name, "version": version,
        "model_kind": classifier.kind, "labels": classifier.labels, "signature": SIGNATURE, "input": INPUT,
        "saved_model_bytes": size, "logged_as": exported_uri, "check": check.as_dict()})
    write_export_manifest(folder, model_uri, check_rows)
    logged = f", logged as {exported_uri}" if exported_uri else ""
    print(f"export: read {model_uri} ({classifier.kind}) and {len(texts):,} test reviews; wrote "
          f"{folder / SAVED_MODEL_DIR} ({size / 1e6:.1f} MB){logged}; "
          f"{check.summary()}; {time.perf_counter() - started:.0f}s")
    return folder / SAVED_MODEL_DIR


def publish(reports_dir: Path, saved_model: Path, run_id: str | None, name: str | None,
            version: str | None) -> str | None:
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
        client.set_model_version_tag(name, version, VERSION_EXPORT_TAG, exported_uri)
        refresh_model_card(reports_dir, name, version)
    return exported_uri


def write_export_manifest(folder: Path, model_uri: str, check_rows: int | None) -> None:
    from pipeline.core.files import build_manifest, sha256_file, write_manifest

    outputs = {str(path.relative_to(folder)): sha256_file(path)
               for path in sorted((folder / SAVED_MODEL_DIR).rglob("*")) if path.is_file()}
    write_manifest(folder, build_manifest("export", "", {"model": model_uri}, {"check_rows": check_rows},
                                          outputs=outputs))


def main(config: Config, args) -> None:
    run(config, model_uri=args.model, check_rows=args.check_rows)
