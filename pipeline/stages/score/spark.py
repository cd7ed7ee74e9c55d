"""Scoring on Apache Spark, the one module that talks to Spark: ``make score ENGINE=spark``.

Reads:  ``--input``: a CSV file, a Parquet file, a folder of either, or a glob (``'reviews/*.csv'``);
        every file needs the text column. The model as for ``make score``.
Writes: ``--output``, a folder of Parquet (default) or CSV part files plus ``_SUCCESS``: every
        input column, then ``positive_probability`` (``probability_<label>`` per class for more
        than two classes), ``predicted_label``, ``score_error`` (and ``explanation`` with ``--explain``,
        the model's ``explain`` request option). Spark writes into a hidden temporary folder beside the
        output, renamed into place once complete; an existing output is refused unless ``--overwrite``
        (then replaced only after the new one is complete).

The model runs through MLflow's ``mlflow.pyfunc.spark_udf`` with the pipeline's own pyfunc model,
so a row gets exactly what ``make score``, ``mlflow models serve`` and ``mlflow models predict`` give
it, unscorable rows included (an empty probability and label, the reason in ``score_error``).
Nothing is shuffled: rows keep their order within each input file, part files follow the input
order, and ``--keep-row-index`` keeps Spark's monotonically increasing ``row_index`` column. Each
executor Python worker keeps the loaded Keras model for all its tasks (``pipeline.model.classifiers``).

In local mode the workers use this interpreter (``PYSPARK_PYTHON`` is set to it); on a cluster,
point ``spark.master`` at it and ship the environment as the cluster expects (README).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from pipeline.config import Config, SparkConfig
from pipeline.core.errors import InputError, MissingInputError, PipelineError
from pipeline.model.classifiers import ERROR_COLUMN
from pipeline.model.explain import EXPLANATION_COLUMN

ROW_INDEX = "row_index"
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
SCORE_STRUCT = "_score"


# --------------------------------------------------------------------------- pure helpers


def resolve_inputs(pattern: str) -> tuple[list[Path], str]:
    """The input files (sorted) and their format for a file, a folder or a glob; one format only."""
    path = Path(pattern)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(
            f
            for f in path.rglob("*")
            if f.is_file() and f.suffix.lower() in FORMATS and not f.name.startswith(("_", "."))
        )
        if not files:
            raise MissingInputError(f"{pattern}: folder holds no .csv or .parquet files")
    else:
        files = sorted(Path(f) for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
        if not files:
            raise MissingInputError(f"no files match {pattern!r}")
    unknown = [f for f in files if f.suffix.lower() not in FORMATS]
    if unknown:
        raise InputError(f"{unknown[0]}: not a .csv or .parquet file")
    formats = {FORMATS[f.suffix.lower()] for f in files}
    if len(formats) > 1:
        raise InputError(f"{pattern!r} mixes CSV and Parquet files; score them separately")
    return files, formats.pop()


def input_columns(files: list[Path], file_format: str) -> list[str]:
    """The columns of the first file; every file must have the same ones (checked without Spark)."""
    columns: list[str] | None = None
    for path in files:
        try:
            names = (
                pq.read_schema(path).names
                if file_format == "parquet"
                else list(pd.read_csv(path, nrows=0, encoding="utf-8-sig").columns)
            )
        except Exception as exc:  # pyarrow and pandas raise several types for a file they cannot read
            raise InputError(f"{path}: cannot read as {file_format}: {exc}") from None
        if columns is None:
            columns = names
        elif names != columns:
            raise InputError(f"{path}: columns {names} differ from {files[0]}'s {columns}")
    if columns is None:
        raise InputError("no input files to read the columns of")
    return columns


def output_schema(model_uri: str, explain: bool = False) -> list[tuple[str, str]]:
    """(name, Spark SQL type) of the columns the model adds, from its logged signature (and ``explanation`` when
    ``explain``: a model logged before its signature took the ``explain`` param is refused)."""
    import mlflow

    try:
        if Path(model_uri).is_dir():  # a model folder: its own MLmodel (its model id need not be in this store)
            signature = mlflow.models.Model.load(model_uri).signature
        else:
            signature = mlflow.models.get_model_info(model_uri).signature
    except (mlflow.exceptions.MlflowException, OSError) as exc:
        raise InputError(f"cannot load model {model_uri!r}: {exc}") from None
    outputs = [
        (spec.name, "double" if getattr(spec.type, "name", "") in ("double", "float") else "string")
        for spec in (signature.outputs.inputs if signature and signature.outputs else [])
    ]
    if ERROR_COLUMN not in [name for name, _ in outputs]:
        raise InputError(
            f"model {model_uri!r} was logged before unscorable rows got a {ERROR_COLUMN!r} column; "
            "retrain it (`make train` or `make compare`) to score it with Spark"
        )
    if explain:
        params = [spec.name for spec in (signature.params.params if signature.params else [])]
        if "explain" not in params:
            raise InputError(
                f"model {model_uri!r} was logged before explanations were a request option; retrain it "
                "(`make train` or `make compare`), or explain it with the local engine"
            )
        outputs.append((EXPLANATION_COLUMN, "string"))
    return outputs


# --------------------------------------------------------------------------- Spark edges


def require_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (str(Path(java_home) / "bin" / "java") if java_home else None)
    if not java or not Path(java).exists():
        raise PipelineError(
            "Spark needs Java 17 or newer and none was found: install a JDK "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return java


def spark_session(spark: SparkConfig):
    """A Spark session on ``spark.master``; in local mode the Python workers run this interpreter."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise PipelineError("Spark scoring needs pyspark: pip install -e '.[spark]' (make setup installs it)") from None
    require_java()
    if spark.master.startswith("local"):  # without it the workers lack pandas and the pipeline
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # (a cluster sets spark.pyspark.python itself)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(spark.master)
        .appName("imdb-sentiment-score")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(spark.batch_rows))
        .config("spark.ui.showConsoleProgress", "true")
    )
    for key, value in spark.settings().items():
        builder = builder.config(key.strip(), value.strip())
    return builder.getOrCreate()


def read_frame(spark, files: list[Path], file_format: str):
    paths = [str(f) for f in files]
    if file_format == "csv":  # every value as text, quoted fields may span lines (as pandas reads them)
        return spark.read.csv(
            paths, header=True, inferSchema=False, multiLine=True, escape='"', encoding="UTF-8", mode="FAILFAST"
        )
    return spark.read.parquet(*paths)


def replace_folder(tmp: Path, output: Path) -> None:
    """Move the finished ``tmp`` folder to ``output``; an old ``output`` goes only after that."""
    backup = None
    if output.exists():
        backup = output.with_name(f".{output.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(output, backup)
    os.replace(tmp, output)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


def checked_inputs(
    input_pattern: str, output: Path, text_column: str, overwrite: bool
) -> tuple[list[Path], str, list[str]]:
    """The input files, their format and columns, once the output and the text column are checked (without Spark)."""
    files, file_format = resolve_inputs(str(input_pattern))
    if output.exists() and not overwrite:
        raise InputError(f"output {output} exists: pass --overwrite (make score ... OVERWRITE=1) to replace it")
    if any(output.resolve() == f.resolve() or output.resolve() in f.resolve().parents for f in files):
        raise InputError(f"refusing to write {output} over the input files: choose another OUTPUT")
    columns = input_columns(files, file_format)
    if text_column not in columns:
        raise InputError(f"{files[0]}: no column {text_column!r}; columns are {columns} (use --text-column)")
    return files, file_format, columns


def scored_frame(
    spark,
    frame,
    model_uri: str,
    added: list[tuple[str, str]],
    columns: list[str],
    text_column: str,
    keep_row_index: bool,
    explain_top: int = 0,
):
    """``frame``'s input ``columns`` (and ``row_index`` if kept), then the ``added`` columns the model at
    ``model_uri`` gives each text (asked for explanations of ``explain_top`` items when that is not 0)."""
    import mlflow
    from pyspark.sql import functions as F

    struct = ", ".join(f"`{name}` {kind}" for name, kind in added)
    params = {"explain": True, "explain_top": explain_top} if explain_top else None
    udf = mlflow.pyfunc.spark_udf(spark, model_uri, result_type=f"struct<{struct}>", env_manager="local", params=params)
    scored = frame.withColumn(SCORE_STRUCT, udf(F.col(f"`{text_column}`")))
    outputs = []
    for name, kind in added:  # NaN (no score) becomes null: an empty cell in CSV, null in Parquet and SQL
        value = F.col(f"{SCORE_STRUCT}.`{name}`")
        outputs.append((F.when(F.isnan(value), None).otherwise(value) if kind == "double" else value).alias(name))
    keep = [F.col(f"`{c}`") for c in columns] + ([F.col(ROW_INDEX)] if keep_row_index else [])
    return scored.select(*keep, *outputs)


def write_folder(result, output: Path, output_format: str, input_pattern: str) -> None:
    """Write ``result`` into a hidden temporary folder beside ``output``, renamed into place once complete (removed
    on any error; a Spark error becomes one line)."""
    from pyspark.errors import PySparkException

    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        writer = result.write.mode("error")
        if output_format == "csv":
            writer.csv(str(tmp), header=True, escape='"')
        else:
            writer.parquet(str(tmp))
        replace_folder(tmp, output)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, PySparkException):  # e.g. a malformed CSV row (FAILFAST): one line, not a JVM trace
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{input_pattern}: Spark could not read or score the input: {first[:500]}") from None
        raise


def count_rows(spark, output: Path, output_format: str) -> tuple[int, int]:
    """The rows and the rows with a ``score_error`` in the written ``output`` folder, in one pass over it."""
    from pyspark.sql import functions as F

    written = (
        spark.read.parquet(str(output))
        if output_format == "parquet"
        else spark.read.csv(str(output), header=True, multiLine=True, escape='"')
    )
    counted = written.agg(
        F.count(F.lit(1)).alias("rows"),  # one pass over the output for both counts
        F.sum((F.col(ERROR_COLUMN).isNotNull() & (F.col(ERROR_COLUMN) != "")).cast("long")).alias("errors"),
    ).first()
    return int(counted["rows"]), int(counted["errors"] or 0)


def score_table(
    config: Config,
    input_pattern: str,
    output_path: str | Path,
    model_uri: str | None = None,
    text_column: str = "text",
    overwrite: bool = False,
    keep_row_index: bool = False,
    explain_top: int = 0,
) -> dict[str, float]:
    """Score every input file with Spark into the ``output_path`` folder as ``spark.output_format`` part files (with
    ``explain_top``, an ``explanation`` column of that many items too); returns the summary counts."""
    from pipeline.tracking import champion_uri, setup_tracking

    started = time.perf_counter()
    output_format = config.spark.output_format
    output = Path(output_path)
    files, file_format, columns = checked_inputs(input_pattern, output, text_column, overwrite)
    setup_tracking(config.tracking)
    model_uri = model_uri or champion_uri(config.tracking)
    added = output_schema(model_uri, explain_top > 0)
    clashes = [name for name, _ in added if name in columns] + ([ROW_INDEX] if ROW_INDEX in columns else [])
    if clashes:
        raise InputError(f"{files[0]}: already has output column(s) {clashes}; rename them first")

    spark = spark_session(config.spark)
    session_seconds = time.perf_counter() - started
    from pyspark.sql import functions as F

    frame = read_frame(spark, files, file_format).withColumn(ROW_INDEX, F.monotonically_increasing_id())
    result = scored_frame(spark, frame, model_uri, added, columns, text_column, keep_row_index, explain_top)
    write_folder(result, output, output_format, input_pattern)
    rows, errors = count_rows(spark, output, output_format)
    seconds = time.perf_counter() - started
    print(
        f"score (spark {config.spark.master}): read {rows:,} rows from {len(files)} {file_format} file(s) "
        f"({input_pattern}); scored {rows - errors:,}, errors {errors:,}; wrote {output}/ ({output_format} parts) "
        f"with {model_uri} in {seconds:.1f}s ({rows / max(seconds, 1e-9):,.0f} rows/s; Spark start-up "
        f"{session_seconds:.1f}s)"
    )
    return {
        "rows": rows,
        "errors": errors,
        "scored": rows - errors,
        "seconds": seconds,
        "startup_seconds": session_seconds,
    }
