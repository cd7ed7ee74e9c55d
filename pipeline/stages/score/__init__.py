"""``make score``: add a probability, a label and an error column to every row of a table of reviews.

Reads:  ``--input`` and a model: ``models:/<name>@<alias>`` (default ``models:/<registered name>@champion``),
        ``runs:/<run_id>/model`` or a local MLflow model folder; any model this pipeline logs
        (a Transformer, the NBSVM baseline or a fused model) answers the same way.
Writes: ``--output`` with every input row, in order, and ``positive_probability`` (one
        ``probability_<label>`` per class for more than two classes), ``predicted_label`` and
        ``score_error`` (empty when the row was scored); with ``--explain`` (``make score EXPLAIN=1``) also
        ``explanation``: the words or n-grams that moved the row's score most, signed and ordered
        (``+great, +loved, -boring``; ``pipeline.model.explain``).

Two engines: ``local`` streams a CSV through this process (``pipeline.stages.score.csv_file``); ``spark`` runs
the same pyfunc model on Spark over CSV or Parquet files, folders or globs (``pipeline.stages.score.spark``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.core.errors import ConfigError, InputError

ENGINES = ("local", "spark")
SPARK_ONLY = ("overwrite", "keep_row_index", "output_format")


def run(
    config: Config,
    input_path: str | Path,
    output_path: str | Path,
    model_uri: str | None = None,
    engine: str = "local",
    **options,
) -> dict:
    """Score ``input_path`` into ``output_path`` with ``engine``; returns the engine's summary. ``explain_top`` (in
    ``options``, default 0): explain every scored row with that many words or n-grams."""
    if engine == "spark":
        from pipeline.stages.score.spark import score_table

        output_format = options.pop("output_format", None)
        if output_format:
            config = config.replace(spark={"output_format": output_format})
        return score_table(config, str(input_path), output_path, model_uri=model_uri, **options)
    if engine != "local":
        raise ConfigError(f"--engine: {engine!r} is not one of {list(ENGINES)}")
    given = [f"--{name.replace('_', '-')}" for name in SPARK_ONLY if options.pop(name, None)]
    if given:
        raise InputError(f"{', '.join(given)} apply to --engine spark only")
    from pipeline.stages.score.csv_file import score_csv

    return score_csv(config.tracking, input_path, output_path, model_uri=model_uri, **options)


def main(config: Config, args) -> None:
    if args.explain and args.explain_top < 1:
        raise ConfigError(f"--explain-top must be 1 or more, got {args.explain_top}")
    options = {"text_column": args.text_column, "explain_top": args.explain_top if args.explain else 0}
    if args.engine == "spark":
        options.update(overwrite=args.overwrite, keep_row_index=args.keep_row_index, output_format=args.output_format)
    else:
        options.update(
            encoding=args.encoding,
            chunk_size=args.chunk_size,
            overwrite=args.overwrite,
            keep_row_index=args.keep_row_index,
            output_format=args.output_format,
        )
    run(config, args.input, args.output, model_uri=args.model, engine=args.engine, **options)
