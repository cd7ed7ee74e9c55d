"""The sections that say how runs are carried out: MLflow tracking, the comparison's design, the Optuna study and
Spark scoring. Frozen dataclasses like ``pipeline.config.sections``."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.sections import INITS, LONG_REVIEWS, POOLINGS
from pipeline.core.errors import ConfigError


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow settings. ``tracking_uri`` empty means $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db."""

    tracking_uri: str | None = None  # none: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment_name: str = "imdb-sentiment"  # the MLflow experiment every run goes to
    registered_model_name: str = "imdb-sentiment"  # the registered model `make register` sets @champion on


# What `make compare` can vary: the compare key holding its levels -> (the setting it sets, the levels it allows).
COMPARE_FACTORS = {
    "poolings": ("model.pooling", POOLINGS),
    "inits": ("model.init", INITS),
    "pseudo_labels": ("training.pseudo_labels", (False, True)),
    "ngrams": ("model.ngram_max", (1, 2, 3, 4)),
    "sparse_updates": ("training.sparse_updates", (False, True)),
    "adversarial_epsilons": ("training.adversarial_epsilon", (0.0, 0.5, 1.0, 2.0, 5.0)),
    "long_reviews": ("model.long_reviews", LONG_REVIEWS),
}


@dataclass(frozen=True)
class CompareConfig:
    """``make compare``: the Transformer variants it trains (every combination of the levels below, each
    with every seed), the baselines and the fused candidates.

    A key with two levels is a factor of the design (at most two factors); a key with one level is a
    setting every variant shares; an empty key (null) keeps the model or training section's value. The
    pooling question needs ``poolings`` with both levels.
    """

    seeds: tuple[int, ...] = (1, 2, 3)  # every variant is trained once per seed
    bootstrap_samples: int = 2000  # resamples of the paired bootstrap CI
    poolings: tuple[str, ...] | None = POOLINGS  # the pooling question's levels
    inits: tuple[str, ...] | None = None  # configs/gpu.yaml compares [pretrained, scratch]
    pseudo_labels: tuple[bool, ...] | None = None  # distillation off and/or on
    ngrams: tuple[int, ...] | None = None  # model.ngram_max levels, e.g. [1, 3]: tokens alone vs with n-grams
    sparse_updates: tuple[bool, ...] | None = None  # training.sparse_updates levels: dense vs lazy embedding updates
    adversarial_epsilons: tuple[float, ...] | None = None  # training.adversarial_epsilon levels, e.g. [0, 2]
    long_reviews: tuple[str, ...] | None = None  # model.long_reviews levels: [truncate, windows]
    fusion: bool = True  # also fuse every Transformer run with the NBSVM baseline (a candidate each)
    fusion_weights: int = 21  # weights 0, 0.05, ..., 1 on the Transformer, chosen on validation
    # > 0: texts of at most this many words get their own fusion weight, chosen on the short validation reviews and
    # the validation sentence crops (cross-fitted for the figures the champion is chosen on); 0: one weight. 80: short
    # texts gain significantly and reviews lose nothing significant (docs/results.md)
    short_fusion_words: int = 80
    # < 1: the fusion is a cascade: its Transformer reads only the texts NBSVM is least sure of, at most this share of
    # the validation reviews (a confidence threshold chosen on them), and the rest keep NBSVM's answer; scoring gets
    # faster by about the inverse of the share. The share is the smallest of 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5 up
    # to this one within champion_tolerance of the fusion of every text (cross-fitted). 1: it reads every text
    cascade_share: float = 1.0
    tfidf_baseline: bool = True  # the earlier TF-IDF + logistic regression baseline, a reference row
    tuned: str | None = None  # make compare-tuned: the tuned config file (null: <reports_dir>/tune/best.yaml)
    # make register: the candidates within this of the best full-review validation accuracy compete on the validation
    # sentence crops (short texts), so long reviews keep their accuracy and short ones get the best of the rest
    champion_tolerance: float = 0.003

    def __post_init__(self) -> None:
        varied = []
        for key, (_, options) in COMPARE_FACTORS.items():
            levels = getattr(self, key) or ()
            unknown = [level for level in levels if level not in options]
            if unknown:
                raise ConfigError(f"compare.{key}: {unknown} not among {list(options)}")
            if len(set(levels)) != len(levels) or len(levels) > 2:
                raise ConfigError(f"compare.{key} takes one or two different levels, got {list(levels)}")
            if len(levels) == 2:
                varied.append(key)
        if len(varied) > 2:
            raise ConfigError(f"compare varies at most two factors at a time, got {varied}")
        if self.fusion_weights < 2:
            raise ConfigError("compare.fusion_weights must be at least 2 (the weights 0 and 1)")
        if self.short_fusion_words < 0:
            raise ConfigError(
                f"compare.short_fusion_words must be 0 (one weight) or more, got {self.short_fusion_words}"
            )
        if not 0.0 < self.cascade_share <= 1.0:
            raise ConfigError(f"compare.cascade_share must be in (0, 1] (1: no cascade), got {self.cascade_share}")
        if not 0.0 <= self.champion_tolerance <= 1.0:
            raise ConfigError(f"compare.champion_tolerance must be in [0, 1], got {self.champion_tolerance}")


@dataclass(frozen=True)
class TuneConfig:
    """``make tune``: the Optuna study over ``space`` (a YAML search space), its budget and its storage.

    ``trials`` counts every finished trial of the study (complete, pruned or failed) across all processes
    sharing it; ``max_minutes`` bounds one ``make tune`` run. ``storage``: any database URL Optuna accepts
    (``postgresql://...`` for a team); empty means ``optuna.db`` beside a SQLite tracking store.
    ``max_train_samples`` caps each trial's training rows (quick studies; the comparison uses them all).
    """

    space: str = "configs/tune.yaml"  # the search space (YAML)
    trials: int | None = 40  # stop after this many finished trials
    max_minutes: float | None = 90.0  # stop after this many minutes
    storage: str | None = None  # an Optuna storage URL processes can share; none: optuna.db beside the MLflow store
    study_name: str = "imdb-sentiment"  # the Optuna study (resumed when it exists)
    seed: int = 0  # the sampler's seed
    pruner_startup_trials: int = 5  # trials before the median pruner acts
    pruner_warmup_epochs: int = 0  # epochs of a trial before it may be pruned
    max_train_samples: int | None = None  # each trial trains on at most this many rows
    heartbeat_seconds: int = 30  # a trial silent for twice this is failed (a killed process's trial)
    start_from_config: bool = True  # a new study's first trial is the configured settings (the bar to beat)

    def __post_init__(self) -> None:
        if self.heartbeat_seconds < 1:
            raise ConfigError("tune.heartbeat_seconds must be positive")
        if self.trials is not None and self.trials < 1:
            raise ConfigError(f"tune.trials must be positive, got {self.trials}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"tune.max_minutes must be positive, got {self.max_minutes}")


SPARK_OUTPUT_FORMATS = ("parquet", "csv")


@dataclass(frozen=True)
class SparkConfig:
    """``make score ENGINE=spark``: where Spark runs and what it writes.

    ``master`` is any Spark master URL (``local[*]``, ``spark://host:7077``, ``yarn``,
    ``k8s://...``); ``conf`` holds extra Spark settings as ``key=value`` strings
    (e.g. ``spark.executor.memory=4g``); ``batch_rows`` is how many rows Spark hands the model
    at a time (``spark.sql.execution.arrow.maxRecordsPerBatch``).
    """

    master: str = "local[*]"  # Spark's master URL (local[*]: every core of the machine it runs on)
    conf: tuple[str, ...] | None = None  # extra Spark settings, key=value
    output_format: str = "parquet"  # parquet or csv part files
    batch_rows: int = 2048  # rows per Arrow batch handed to the model

    def __post_init__(self) -> None:
        if self.output_format not in SPARK_OUTPUT_FORMATS:
            raise ConfigError(f"spark.output_format must be one of {SPARK_OUTPUT_FORMATS}, got {self.output_format!r}")
        if self.batch_rows < 1:
            raise ConfigError("spark.batch_rows must be positive")
        for item in self.conf or ():
            if "=" not in item or not item.split("=", 1)[0].strip():
                raise ConfigError(f"spark.conf entries are 'key=value' strings, got {item!r}")

    def settings(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.conf or ())
