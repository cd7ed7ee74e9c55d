"""``make bench``: utilisation against this run's own GEMM peak, scoring speed and memory.

Reads:  ``data/tokenize/`` (train token ids, for real review lengths), ``data/ingest/test.parquet``
        (texts to score) and a model URI (default: the registered champion).
Writes: ``reports/bench.json`` and ``reports/bench.md``:
        - peak: ``tf.matmul`` GFLOP/s in float32 and bfloat16 for a 2048^3 square and for the GEMM
          shapes of the measured encoders;
        - training steps (classifier and masked-LM) for each measured encoder in float32,
          ``mixed_bfloat16`` and float32 with XLA, on length-bucketed batches of real train ids,
          warm-up (the first pass, which traces every batch width) excluded: non-padding tokens/s,
          achieved GFLOP/s (``pipeline.model.flops``) and the fraction of the same-run, same-precision peak;
        - TensorFlow thread settings (intra-op, inter-op) for the classifier step, each in a fresh process;
        - the padding fraction of full-width and of length-bucketed batches;
        - scoring: the model alone (compiled, bucketed) against the eager per-batch path, tokenization
          alone, a CSV end to end, and the peak memory of ``score`` for N and 10 x N rows;
        - n-grams: the configured encoder's model-alone scoring rate without and with hashed n-gram embeddings;
        - export: the model's exported TensorFlow graph (``make export``) against ``make score``'s pyfunc model, side
          by side, and its size on disk.

Figures are ratios measured in one run: absolute times on these shared machines vary 2x between runs.
The training measurements live in ``training_steps``, the scoring ones in ``scoring_speed`` and the Markdown
report in ``report``; this module runs them and writes the files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab.experiments.bench.report import markdown_report, utilisation_rows
from lab.experiments.bench.scoring_speed import (
    NoCascade,
    NoTransformer,
    measure_cascade,
    measure_export,
    measure_int8,
    measure_ngram_scoring,
    measure_scoring,
)
from lab.experiments.bench.serve_load import measure_serving
from lab.experiments.bench.training_steps import (
    MEASURED_BATCHES,
    REFERENCE_ENCODERS,
    measure_peak,
    measure_sparse_updates,
    measure_training_steps,
    measured_encoders,
    padding_fractions,
    sample_batches,
)
from pipeline.config import Config
from pipeline.core.catalog import require_output
from pipeline.core.errors import ConfigError
from pipeline.core.files import atomic_write_json, atomic_write_text
from pipeline.stages.ingest.outputs import read_split, split_path
from pipeline.stages.tokenize.outputs import load_split
from pipeline.text.text_tokenizer import load_text_tokenizer

__all__ = [
    "REFERENCE_ENCODERS",
    "main",
    "markdown_report",
    "measure_ngram_scoring",
    "measure_sparse_updates",
    "measured_encoders",
    "run",
    "sample_batches",
    "utilisation_rows",
]


def summary_line(results: dict, read: str, wrote: str) -> str:
    """The line ``make bench`` prints: what it ``read``, its best utilisation, CSV scoring's fraction of the model-alone
    rate (when measured) and what it ``wrote``."""
    best = max(utilisation_rows(results), key=lambda row: row["fraction_of_peak"], default=None)
    return (
        f"bench: read {read}; "
        + (
            f"best training step {best['fraction_of_peak']:.0%} of the same-run peak ({best['workload']}, "
            f"{best['encoder']}, {best['variant']}); "
            if best
            else ""
        )
        + (
            f"CSV scoring {results['scoring']['score_csv_fraction_of_model_only']:.0%} of model-alone rate "
            f"({results['scoring']['score_csv_streaming_fraction_of_model_only']:.0%} after the model load); "
            if "scoring" in results
            else ""
        )
        + f"wrote {wrote}"
    )


def run(config: Config, model_uri: str | None, rows: int, repeat: int, sections: tuple[str, ...] = ("all",)) -> dict:
    """Measure the ``sections`` asked for (``all``, ``train``, ``score``, ``sparse``, ``ngrams``, ``export``,
    ``int8``, ``cascade``, ``serve``) and write
    ``reports/bench.{json,md}``; returns the results."""
    from pipeline.tracking import champion_uri, setup_tracking

    if rows < 1 or repeat < 1:
        raise ConfigError(f"--rows and --repeat must be positive, got {rows} and {repeat}")
    tokenize_dir = require_output(config, "tokenize")
    ingest_dir = require_output(config, "ingest")
    everything = "all" in sections
    text_tokenizer = load_text_tokenizer(tokenize_dir)  # the pipeline's WordPiece or a preset's
    train_ids = np.asarray(load_split(tokenize_dir, "train")[0])
    vocabulary_size, max_length = text_tokenizer.vocabulary_size, text_tokenizer.settings.max_sequence_length
    encoders = measured_encoders(config.model)
    batch_size = config.training.batch_size
    batches = sample_batches(train_ids, batch_size, MEASURED_BATCHES)
    results: dict = {
        "batch_size": batch_size,
        "measured_batches": len(batches),
        "padding": padding_fractions(train_ids, batch_size, max_length),
    }
    results["peak"] = measure_peak(encoders, tokens=batch_size * 128)
    if everything or "train" in sections:
        results.update(
            measure_training_steps(encoders, vocabulary_size, max_length, batches, config.pretrain.mask_rate)
        )
    test = stratified_rows(read_split(ingest_dir, "test", columns=["text", "label"]), rows)  # what scoring scores
    texts = test["text"]
    model_uri = model_uri or champion_uri(config.tracking)  # a name only: read where score or export is asked
    if everything or {"score", "export", "int8", "cascade", "serve"} & set(sections):
        setup_tracking(config.tracking)
    if everything or "score" in sections:
        results["scoring"] = {
            "model_uri": model_uri,
            "rows": len(texts),
            **measure_scoring(config.tracking, model_uri, texts, repeat),
        }
    if everything or "sparse" in sections:
        results["sparse_updates"] = measure_sparse_updates(config.model, vocabulary_size, max_length, batches)
    if everything or "ngrams" in sections:
        results["ngram_scoring"] = measure_ngram_scoring(
            config.model, vocabulary_size, max_length, text_tokenizer.encode(texts.tolist())
        )
    if everything or "export" in sections:
        results["export"] = measure_export(model_uri, texts)
    if everything or "int8" in sections:
        try:
            results["int8"] = {"model_uri": model_uri, **measure_int8(model_uri, texts, test["label"].to_numpy())}
        except NoTransformer as error:
            if not everything:  # asked for by name: the user meant a model with a Transformer
                raise
            print(f"bench: int8 not measured: {error}")
    if everything or "cascade" in sections:
        try:
            measured = measure_cascade(config.tracking, model_uri, texts, test["label"].to_numpy())
            results["cascade"] = {"model_uri": model_uri, **measured}
        except NoCascade as error:
            if not everything:
                raise
            print(f"bench: cascade not measured: {error}")
    if everything or "serve" in sections:
        results["serving"] = measure_serving(config.tracking, model_uri, texts.tolist())
    json_path = atomic_write_json(config.reports_dir / "bench.json", results)
    md_path = atomic_write_text(config.reports_dir / "bench.md", markdown_report(results))
    read = f"{len(train_ids):,} train rows from {tokenize_dir}/ and {split_path(ingest_dir, 'test')}"
    print(summary_line(results, read, f"{md_path} and {json_path.name}"))
    return results


def main(config: Config, args) -> None:
    run(config, args.model, args.rows, args.repeat, tuple(args.only or ("all",)))


def stratified_rows(frame: pd.DataFrame, rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` rows of ``frame`` drawn with each label's share (the splits are stored in label order: their first rows
    are of one class), in ``frame``'s order; every row when it has no more."""
    if rows >= len(frame):
        return frame
    from sklearn.model_selection import train_test_split

    kept, _ = train_test_split(frame, train_size=rows, stratify=frame["label"], random_state=seed)
    return kept.sort_index()
