"""``make export``: a model (default the champion) as one TensorFlow SavedModel, raw text in, probability out.

Reads:  a model (``models:/<registered name>@champion`` by default, any ``models:/``, ``runs:/`` or model folder)
        and ingest's test split, for the identity check.
Writes: ``data/export/saved_model/`` (signature ``serving_default``: ``text: string[N]`` ->
        ``positive_probability`` (``probabilities`` for more classes), ``predicted_label``, ``score_error``),
        ``data/export/export.json`` (the model, the signature, the size, the check) and a manifest. On MLflow: the
        SavedModel as artifacts of the model's run (``export/saved_model``), its URI as the registered version's tag
        ``saved_model``, named in the version's model card.

Nothing is written unless the graph gives ``make score``'s answers on the test split (``pipeline.stages.export.check``);
a previous export stays until a new one has passed. Each kind of model builds its own graph (``pipeline.model.kinds``:
its ``graph``) from ``pipeline.text.graph_ops``.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.config import Config
from pipeline.core.catalog import EXPORT_SETTINGS_FILE, SAVED_MODEL_DIR, require_output, stage_dir
from pipeline.core.errors import ConfigError, PipelineError
from pipeline.core.files import atomic_write_json, folder_bytes, staged_directory
from pipeline.runtime.backend import require_tensorflow
from pipeline.stages.export import check as checking
from pipeline.stages.export import publish as publishing  # as modules, so that a test can replace a function
from pipeline.stages.ingest.outputs import read_split

DEFAULT_CHECK_ROWS = None  # every test review


def run(config: Config, model_uri: str | None = None, check_rows: int | None = DEFAULT_CHECK_ROWS) -> Path:
    """Export ``model_uri`` (default the champion) into ``data/export/``; returns the SavedModel's folder."""
    import tensorflow as tf

    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.export.graph import INPUT, SIGNATURE, write_saved_model
    from pipeline.tracking import champion_uri, setup_tracking

    require_tensorflow(
        "make export (a TensorFlow SavedModel)",
        "export on the default backend (a model trained on any backend loads there)",
    )
    if check_rows is not None and check_rows < 0:
        raise ConfigError(f"--check-rows must be 0 or more (the test reviews to check), got {check_rows}")
    started = time.perf_counter()
    setup_tracking(config.tracking)
    model_uri = model_uri or champion_uri(config.tracking)
    texts = read_split(require_output(config, "ingest"), "test", columns=["text"])["text"].tolist()[:check_rows]
    run_id, name, version = publishing.model_source(model_uri)
    classifier = load_classifier(model_uri)
    folder = stage_dir(config, "export")
    with staged_directory(folder / SAVED_MODEL_DIR) as staging:
        write_saved_model(classifier, staging)
        check = checking.identity_check(tf.saved_model.load(str(staging)).signatures[SIGNATURE], classifier, texts)
        if not check.passed:
            raise PipelineError(f"export: {check.summary()}; nothing written (a previous export is kept)")
        size = folder_bytes(staging)
        # logged before it replaces the previous export: a failed MLflow call leaves saved_model/, export.json and
        # the manifest all describing the previous model
        exported_uri = publishing.publish(config.reports_dir, staging, run_id, name, version)
    atomic_write_json(
        folder / EXPORT_SETTINGS_FILE,
        {
            "model_uri": model_uri,
            "run_id": run_id,
            "registered_model": name,
            "version": version,
            "model_kind": classifier.kind,
            "labels": classifier.labels,
            "signature": SIGNATURE,
            "input": INPUT,
            "saved_model_bytes": size,
            "logged_as": exported_uri,
            "check": check.as_dict(),
        },
    )
    publishing.write_export_manifest(folder, model_uri, check_rows)
    logged = f", logged as {exported_uri}" if exported_uri else ""
    print(
        f"export: read {model_uri} ({classifier.kind}) and {len(texts):,} test reviews; wrote "
        f"{folder / SAVED_MODEL_DIR} ({size / 1e6:.1f} MB){logged}; "
        f"{check.summary()}; {time.perf_counter() - started:.0f}s"
    )
    return folder / SAVED_MODEL_DIR


def main(config: Config, args) -> None:
    run(config, model_uri=args.model, check_rows=args.check_rows)
