"""``make score``: add a probability, a label and an error column to every row of a table of reviews.

Reads:  ``--input`` and a model: ``models:/<name>@<alias>`` (default ``models:/<registered name>@champion``),
        ``runs:/<run_id>/model`` or a local MLflow model folder; any model this pipeline logs
        (a Transformer, the NBSVM baseline or a fused model) answers the same way.
Writes: ``--output`` with every input row, in order, and ``positive_probability`` (one
        ``probability_<label>`` per class for more than two classes), ``predicted_label`` and
        ``score_error`` (empty when the row was scored).

Two engines: ``local`` streams a CSV through this process (``pipeline.stages.score.csv_file``); ``spark`` runs
the same pyfunc model on Spark over CSV or Parquet files, folders or globs (``pipeline.stages.score.spark``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.core.errors import ConfigError, InputError

ENGINES = ("local", "spark")
SPARK_ONLY = ("overwrite", "keep_row_index", "output_format")


def run(config: Config, input_path: str | Path, output_path: str | Path, model_uri: str | None = None,
        engine: str = "local", **options) -> dict:
    """Score ``input_path`` into ``output_path`` with ``engine``; returns the engine's summary."""
    if engine == "spark":
        from pipeline.stages.score.spark import score_table

        return score_table(config, str(input_path), output_path, model_uri=model_uri, **options)
    if engine != "local":
        raise ConfigError(f"--engine: {engine!r} is not one of {list(ENGINES)}")
    given = [f"--{name.replace('_', '-')}" for name in SPARK_ONLY if options.pop(name, None)]
    if given:
        raise InputError(f"{', '.join(given)} apply to --engine spark only")
    from pipeline.stages.score.csv_file import score_csv

    return score_csv(config.tracking, input_path, output_path, model_uri=model_uri, **options)


def main(config: Config, args) -> None:
    options = {"text_column": args.text_column}
    if args.engine == "spark":
        options.update(overwrite=args.overwrite, keep_row_index=args.keep_row_index, output_format=args.output_format)
    else:
        options.update(encoding=args.encoding, chunk_size=args.chunk_size, overwrite=args.overwrite,
                       keep_row_index=args.keep_row_index, output_format=args.output_format)
    run(config, args.input, args.output, model_uri=args.model, engine=args.engine, **options)
