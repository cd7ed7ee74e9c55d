"""The experiments: runners that answer research questions about the product, apart from its stages.

Each is a ``make`` target and a ``python -m lab`` sub-command (``lab/__main__.py``), declared in :data:`EXPERIMENTS`
(the :class:`pipeline.core.catalog.Stage` entries the product's stage table uses), and like a stage it calls the
libraries in ``pipeline/`` and the stages it reads or runs (declared in its entry: ``reads``, ``runs``), never one
downstream of those. Their outputs are reports (``reports/``), an Optuna study, screenshots; what a user deploys
comes from the stages alone.
"""

from __future__ import annotations

import argparse
import os

from pipeline.core.catalog import Stage, model_argument
from pipeline.core.errors import ConfigError

# the defaults of the experiments' options, one definition each (their runners' defaults too)
DEFAULT_SIZES = "250,500,1000,2000,5000,all"  # learning-curve: labelled train rows per point; all: the whole split
DEFAULT_MAX_WORDS = 80  # short-reviews: at 80 words a review fits a 128-token encoder whole


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    """``--seeds``: comma-separated integers (None: the config's ``compare.seeds``)."""
    try:
        return None if text is None else tuple(int(seed) for seed in text.split(","))
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {text!r}") from None


def _tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trials", type=int, default=None, help="finished trials the study should hold (default: tune.trials)"
    )
    parser.add_argument(
        "--trial",
        type=int,
        default=None,
        help="also write this complete trial's config, reports/tune/trial-<n>.yaml, for "
        "compare.tuned (the best one is always reports/tune/best.yaml)",
    )


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    model_argument(parser)
    parser.add_argument("--rows", type=int, default=25000, help="test reviews in the small CSV")
    parser.add_argument("--repeat", type=int, default=10, help="the big CSV is the small one repeated this often")
    parser.add_argument(
        "--only",
        action="append",
        choices=("train", "score", "ngrams", "sparse", "export", "int8", "cascade", "serve"),
        help="measure only training steps, scoring, the model's scoring rate with and without "
        "n-grams, its training step with dense and lazy (sparse) embedding updates, its "
        "exported graph against make score, its Transformer in float32 against int8, or a cascaded "
        "fusion's make score against its Transformer and its NBSVM alone, or make serve under 1-64 clients and bad "
        "requests (repeatable; default: everything)",
    )


def _curve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help="labelled train rows per point, comma-separated; 'all' is the whole train split",
    )
    parser.add_argument("--seeds", default=None, help="seeds per size, comma-separated (default: compare.seeds)")


def _short_reviews_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-words", type=int, default=DEFAULT_MAX_WORDS, help="keep reviews of at most this many words"
    )


def _screenshot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default=None, help="folder for the PNGs (default: <reports>/ui)")


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeds", default=None, help="fine-tuning seeds per budget, comma-separated (default: compare.seeds)"
    )
    parser.add_argument(
        "--baseline",
        type=float,
        default=None,
        help="lexical baseline test accuracy to draw on the plot (default: from reports/comparison.json)",
    )


def _gpu_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bundle", default="gpu_check", help="the bundle folder (default: gpu_check)")
    parser.add_argument(
        "--make-bundle",
        action="store_true",
        help="write the bundle from this config's ingest and tokenize outputs (needs TensorFlow)",
    )
    parser.add_argument("--no-wheels", action="store_true", help="with --make-bundle: no wheels (the data only)")
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT", "reports/gpu_check"),
        help="where the summary, the comparison's reports and mlflow.db go (default: $OUT)",
    )
    parser.add_argument(
        "--work",
        default="/tmp/gpu_check",
        help="the check's data folder, reports and MLflow store (default: /tmp/gpu_check)",
    )


EXPERIMENTS: dict[str, Stage] = {
    stage.name: stage
    for stage in (
        Stage(
            "compare-tuned",
            "lab.experiments.compare_tuned",
            "make tune's best config (compare.tuned) against this "
            "config, with NBSVM and the fused candidates, as one comparison make register chooses from",
            reads=("tune", "tokenize", "ingest"),
            runs=("pretrain", "pseudo-label", "train", "evaluate"),
            writes="an MLflow parent run with its children; reports/comparison_tuned.*",
            force=True,
        ),
        Stage(
            "ablate-position",
            "lab.experiments.ablate_position",
            "learned vs no positions, everything else as configured (an ablation: its runs are not candidates)",
            reads=("tokenize", "ingest"),
            runs=("pretrain", "pseudo-label", "train", "evaluate"),
            writes="an MLflow parent run with its children; reports/ablation_position.*",
            force=True,
        ),
        Stage(
            "pretrain-budget",
            "lab.experiments.pretrain_budget",
            "test accuracy against minutes of pretraining",
            reads=("tokenize",),
            runs=("pretrain", "train", "evaluate"),
            writes="reports/pretraining_budget.{json,md,png}",
            arguments=_budget_arguments,
        ),
        Stage(
            "learning-curve",
            "lab.experiments.learning_curve",
            "test accuracy against labelled training rows "
            "for each pooling of the configured encoder, NBSVM and their fusions, with the paired statistics; what to "
            "deploy at each size",
            reads=("tokenize", "ingest"),
            runs=("train", "evaluate"),
            writes="an MLflow run per Transformer and one with reports/learning_curve.{json,md,png}",
            arguments=_curve_arguments,
        ),
        Stage(
            "short-reviews",
            "lab.experiments.short_reviews",
            "IMDB's reviews of at most --max-words words, as "
            "a table with their splits: the short-text set for the learning curve",
            reads=("ingest",),
            writes="data/short_reviews/reviews.parquet",
            arguments=_short_reviews_arguments,
        ),
        Stage(
            "tune",
            "lab.experiments.tune",
            "an Optuna study over configs/tune.yaml, every trial an MLflow run; the "
            "best parameters as a config for make compare-tuned",
            reads=("tokenize", "ingest"),
            runs=("train",),
            writes="the study in Optuna storage; a parent MLflow run with a child per trial; reports/tune/best.yaml",
            arguments=_tune_arguments,
            locks=False,  # several processes share one study by design, each trial in run folders of its own
        ),
        Stage(
            "bench",
            "lab.experiments.bench",
            "training and scoring speed against the same run's GEMM peak; memory",
            reads=("tokenize", "ingest", "register"),
            runs=("export",),
            writes="reports/bench.{json,md}",
            arguments=_bench_arguments,
        ),
        Stage(
            "gpu-check",
            "lab.experiments.gpu_check",
            "the comparison on Keras' JAX backend where TensorFlow is "
            "missing (a GPU machine), from a bundle made here with --make-bundle: per-epoch time, ms per step, share "
            "of the card's peak, test accuracy per candidate",
            reads=(),
            runs=("ingest", "tokenize", "train", "evaluate", "compare"),
            writes="gpu_check/ (--make-bundle); $OUT/{summary.md,comparison.*,mlflow.db}",
            arguments=_gpu_check_arguments,
        ),
        Stage(
            "ui-screenshots",
            "lab.experiments.ui_screenshots",
            "screenshots of the MLflow UI pages of the latest comparison",
            reads=("compare",),
            writes="reports/ui/{runs_table,comparison_run,compare_children}.png",
            arguments=_screenshot_arguments,
        ),
    )
}
