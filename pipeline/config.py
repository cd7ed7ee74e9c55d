"""Typed, frozen configuration loaded from YAML and validated on load.

One dataclass per concern (paths, data, tokenizer, model, training, pretrain,
pseudo_label, baseline, tracking, compare, spark). ``load_config(path, overrides)`` reads a YAML file, applies
``section.key=value`` overrides and returns a frozen :class:`Config`. Unknown
sections or keys and wrongly typed values raise ``ValueError`` naming the key
and the file, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from pipeline.errors import ConfigError, MissingInputError
from pipeline.typed_values import build_sections

CANONICAL_IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
CANONICAL_IMDB_MD5 = "7c2ac02c03563afcf9b574c7e56c153a"


@dataclass(frozen=True)
class PathsConfig:
    """Where stage outputs and reports go (relative paths are relative to the working directory)."""

    data_dir: str = "data"
    reports_dir: str = "reports"


DATA_SOURCES = ("imdb", "table")


@dataclass(frozen=True)
class DataConfig:
    """Where the labelled texts come from and how the splits are drawn.

    ``source: imdb`` reads the aclImdb archive; ``source: table`` reads the user's CSV/TSV/Parquet
    file(s) at ``path`` with ``text_column`` and ``label_column``, split by ``split_column``
    (values train/val/test) or, without one, by stratified seeded ``test_fraction`` and
    ``validation_fraction``. With ``group_column`` (tables) or the archive's ``train/urls_*.txt`` (IMDB:
    the movie each review is about) the validation split holds whole groups, so validation does not
    see the movies training saw; ``group_validation: false`` turns that off.
    """

    source: str = "imdb"
    archive: str | None = None
    path: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    split_column: str | None = None
    group_column: str | None = None  # tables: reviews of one group (e.g. one movie) stay on one side of train/val
    group_validation: bool = True    # IMDB: hold whole movies out for validation when the archive names them
    test_fraction: float = 0.2
    archive_sha256: str | None = None
    unlabeled_archive: str | None = None  # train/unsup reviews when the archive lacks them ($IMDB_UNSUP_ARCHIVE)
    max_unlabeled: int | None = None
    download_url: str = CANONICAL_IMDB_URL
    download_md5: str = CANONICAL_IMDB_MD5
    validation_fraction: float = 0.1
    seed: int = 1337

    def __post_init__(self) -> None:
        if self.source not in DATA_SOURCES:
            raise ConfigError(f"data.source must be one of {DATA_SOURCES}, got {self.source!r}")
        if self.source == "table" and not self.path:
            raise ConfigError("data.source 'table' needs data.path (a CSV, TSV or Parquet file, a glob or a folder)")
        for name in ("validation_fraction", "test_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"data.{name} must be in (0, 1), got {getattr(self, name)}")


TRUNCATION_STRATEGIES = ("head", "tail", "head_tail")


@dataclass(frozen=True)
class TokenizerConfig:
    """WordPiece vocabulary learning and fixed-length encoding."""

    vocabulary_size: int = 20000
    lowercase: bool = True
    min_frequency: int = 5      # words rarer than this are not learned (speeds learning ~4x)
    max_sequence_length: int = 256
    truncation: str = "head_tail"  # keep the first head_tokens and the last (max_sequence_length - 1 - head_tokens)
    head_tokens: int = 64
    include_unlabeled: bool = True  # learn the vocabulary on the unlabeled reviews too, when ingested

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATION_STRATEGIES:
            raise ConfigError(
                f"tokenizer.truncation must be one of {TRUNCATION_STRATEGIES}, got {self.truncation!r}"
            )
        if self.max_sequence_length < 2:
            raise ConfigError("tokenizer.max_sequence_length must be at least 2 ([CLS] plus one token)")
        if not 0 <= self.head_tokens <= self.max_sequence_length - 1:
            raise ConfigError(
                "tokenizer.head_tokens must be between 0 and max_sequence_length - 1, "
                f"got {self.head_tokens}"
            )
        if self.vocabulary_size < 10:
            raise ConfigError(f"tokenizer.vocabulary_size is too small: {self.vocabulary_size}")


POOLINGS = ("first_token", "mean")
POSITIONS = ("learned", "sinusoidal", "none")
INITS = ("scratch", "pretrained")
TOKEN_EMBEDDINGS = ("random", "word2vec")
BACKBONE_KEYS = ("position", "hidden_dim", "num_layers", "num_heads", "intermediate_dim", "dropout")
NGRAM_KEYS = ("ngram_max", "ngram_buckets", "ngram_dropout")
PRESET_KEYS = ("preset", "preset_max_parameters_on_cpu")


# What `make compare` can vary: the compare key holding its levels -> (the setting it sets, the levels it allows).
COMPARE_FACTORS = {"poolings": ("model.pooling", POOLINGS), "inits": ("model.init", INITS),
                   "token_embeddings": ("model.token_embedding", TOKEN_EMBEDDINGS),
                   "pseudo_labels": ("training.pseudo_labels", (False, True)),
                   "ngrams": ("model.ngram_max", (1, 2, 3, 4))}


@dataclass(frozen=True)
class ModelConfig:
    """Transformer encoder classifier shape."""

    pooling: str = "first_token"
    position: str = "learned"
    hidden_dim: int = 64
    num_layers: int = 1
    num_heads: int = 2
    intermediate_dim: int = 128
    dropout: float = 0.2
    classifier_dropout: float = 0.3
    init: str = "scratch"           # scratch | pretrained (`make pretrain`'s backbone; -1.04 points here: docs/results.md)
    pretrained: str | None = None   # a pretrain output folder or runs:/<run_id>/backbone; default data/pretrain
    token_embedding: str = "random"  # random | word2vec (vectors learned on train + unlabeled, pipeline.word_vectors)
    ngram_max: int = 3              # 1: tokens alone; 3: + hashed 2- and 3-grams (+0.86 points, significant: docs/results.md)
    ngram_buckets: int = 262_144    # rows of the hashed n-gram table shared by every n (2^18)
    ngram_dropout: float = 0.3      # drop whole n-gram vectors while training (0.0 stopped a run at epoch 1)
    # A pretrained KerasHub encoder to fine-tune instead (a preset name, or a folder save_to_preset wrote): its own
    # tokenizer and backbone, the pipeline's pooling and head; the shape keys above then do not apply
    preset: str | None = None
    preset_max_parameters_on_cpu: int = 20_000_000  # refuse to fine-tune a larger preset without a GPU

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ConfigError(f"model.init must be one of {INITS}, got {self.init!r}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"model.pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.token_embedding not in TOKEN_EMBEDDINGS:
            raise ConfigError(f"model.token_embedding must be one of {TOKEN_EMBEDDINGS}, got {self.token_embedding!r}")
        if self.position not in POSITIONS:
            raise ConfigError(f"model.position must be one of {POSITIONS}, got {self.position!r}")
        if self.hidden_dim % self.num_heads:
            raise ConfigError(
                f"model.hidden_dim ({self.hidden_dim}) must be divisible by model.num_heads ({self.num_heads})"
            )
        if not 1 <= self.ngram_max <= 8:
            raise ConfigError(f"model.ngram_max must be between 1 (tokens only) and 8, got {self.ngram_max}")
        if self.ngram_buckets < 2:
            raise ConfigError(f"model.ngram_buckets must be at least 2, got {self.ngram_buckets}")
        for name in ("dropout", "classifier_dropout", "ngram_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1)")
        if self.preset is not None:
            if not self.preset.strip():
                raise ConfigError("model.preset must name a KerasHub preset or a preset folder (or be null)")
            own = {"init": ("scratch", "masked-LM pretraining"), "token_embedding": ("random", "word2vec vectors"),
                   "ngram_max": (1, "hashed n-grams")}
            for key, (plain, what) in own.items():
                if getattr(self, key) != plain:
                    raise ConfigError(f"model.{key} must be {plain} with model.preset ({what}: for the pipeline's "
                                      f"own encoder only); set model.{key}={plain}")


PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")


@dataclass(frozen=True)
class TrainingConfig:
    """Optimiser, schedule, budget and hardware policy."""

    batch_size: int = 64
    epochs: int = 3
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    early_stopping_patience: int = 1
    seed: int = 42
    precision: str = "auto"  # float32 on CPU below width 256, mixed_bfloat16 above (bf16 CPUs), mixed_float16 on GPU
    max_train_samples: int | None = None
    length_multiple: int = 16  # batches are trimmed to their longest review rounded up to this
    class_weights: bool = False
    fine_tune_learning_rate: float = 1e-3  # instead of learning_rate when model.init is pretrained (3e-4: 1.1-1.9 points worse)
    fine_tune_warmup_fraction: float = 0.1
    pseudo_labels: bool = False  # also train on the unlabeled reviews the teacher is sure of (make pseudo-label)
    freeze_backbone_epochs: int = 0  # model.preset: train the new head alone first, the pretrained backbone frozen

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"training.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.batch_size < 1 or self.epochs < 1 or self.length_multiple < 1:
            raise ConfigError("training.batch_size, training.epochs and training.length_multiple must be positive")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError("training.warmup_fraction must be in [0, 1)")
        if not 0 <= self.freeze_backbone_epochs < self.epochs:
            raise ConfigError(f"training.freeze_backbone_epochs must be at least 0 and below training.epochs "
                              f"({self.epochs}), got {self.freeze_backbone_epochs}")
        if self.pseudo_labels and self.max_train_samples:
            # the teacher is fitted on the whole train split: its labels would carry the gold labels left out
            raise ConfigError("training.pseudo_labels and training.max_train_samples cannot be combined: the "
                              "pseudo-label teacher is fitted on the whole train split")


@dataclass(frozen=True)
class PretrainConfig:
    """Masked-language-model pretraining of the ``model`` section's encoder on train + unlabeled reviews.

    The budget is ``max_minutes`` of training time and/or ``max_steps``, whichever ends first;
    metrics are logged and a checkpoint is written every ``log_every_steps`` steps.
    """

    max_minutes: float | None = None
    max_steps: int | None = 1500     # about 15 minutes on 2 CPU cores; steps, not minutes: the same on any machine
    batch_size: int = 64
    learning_rate: float = 5e-4
    warmup_steps: int = 300
    weight_decay: float = 0.01
    mask_rate: float = 0.15
    log_every_steps: int = 100
    max_texts: int | None = None
    seed: int = 0
    precision: str = "auto"
    snapshot_minutes: tuple[float, ...] | None = None  # also keep the backbone as it was after these minutes

    def __post_init__(self) -> None:
        if self.max_minutes is None and self.max_steps is None:
            raise ConfigError("pretrain needs a budget: pretrain.max_minutes and/or pretrain.max_steps")
        if (self.max_minutes is not None and self.max_minutes <= 0) or (self.max_steps is not None and self.max_steps < 1):
            raise ConfigError("pretrain.max_minutes and pretrain.max_steps must be positive")
        if not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"pretrain.mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.batch_size < 1 or self.log_every_steps < 1:
            raise ConfigError("pretrain.batch_size and pretrain.log_every_steps must be positive")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"pretrain.precision must be one of {PRECISIONS}, got {self.precision!r}")


PSEUDO_LABEL_TEACHERS = ("nbsvm", "tfidf")


@dataclass(frozen=True)
class PseudoLabelConfig:
    """``make pseudo-label``: self-training data from the unlabeled reviews.

    The teacher (``nbsvm``: the comparison's NBSVM baseline; ``tfidf``: TF-IDF + logistic regression;
    both fitted on the train split only) labels every unlabeled review; those whose top-class
    probability is at least ``min_confidence`` join the training set when ``training.pseudo_labels``
    is on: as their most likely class, or with ``soft`` as the teacher's probabilities (distillation).
    """

    teacher: str = "nbsvm"
    min_confidence: float = 0.5  # with two classes 0.5 keeps every review (docs/results.md)
    soft: bool = True            # train on the teacher's probabilities, not its hard labels
    seed: int = 1337

    def __post_init__(self) -> None:
        if self.teacher not in PSEUDO_LABEL_TEACHERS:
            raise ConfigError(f"pseudo_label.teacher must be one of {PSEUDO_LABEL_TEACHERS}, got {self.teacher!r}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ConfigError(f"pseudo_label.min_confidence must be in [0, 1], got {self.min_confidence}")


@dataclass(frozen=True)
class BaselineConfig:
    """The NBSVM baseline (``pipeline.baseline``): its n-grams and the ``C`` values validation chooses from."""

    nbsvm_c: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0)
    ngram_max: int = 3
    max_features: int = 800_000
    seed: int = 0

    def __post_init__(self) -> None:
        if any(c <= 0 for c in self.nbsvm_c):
            raise ConfigError(f"baseline.nbsvm_c values must be positive, got {list(self.nbsvm_c)}")
        if self.ngram_max < 1 or self.max_features < 1:
            raise ConfigError("baseline.ngram_max and baseline.max_features must be positive")


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow settings. ``tracking_uri`` empty means $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db."""

    tracking_uri: str | None = None
    experiment_name: str = "imdb-sentiment"
    registered_model_name: str = "imdb-sentiment"


@dataclass(frozen=True)
class CompareConfig:
    """``make compare``: the Transformer variants it trains (every combination of the levels below, each
    with every seed), the baselines and the fused candidates.

    A key with two levels is a factor of the design (at most two factors); a key with one level is a
    setting every variant shares; an empty key (null) keeps the model or training section's value. The
    pooling question needs ``poolings`` with both levels.
    """

    seeds: tuple[int, ...] = (1, 2, 3)
    bootstrap_samples: int = 2000
    poolings: tuple[str, ...] | None = POOLINGS
    inits: tuple[str, ...] | None = None        # configs/gpu.yaml compares [pretrained, scratch]
    token_embeddings: tuple[str, ...] | None = None
    pseudo_labels: tuple[bool, ...] | None = None
    ngrams: tuple[int, ...] | None = None      # model.ngram_max levels, e.g. [1, 3]: tokens alone vs with n-grams
    fusion: bool = True            # also fuse every Transformer run with the NBSVM baseline (a candidate each)
    fusion_weights: int = 21       # weights 0, 0.05, ..., 1 on the Transformer, chosen on validation
    tfidf_baseline: bool = True    # the earlier TF-IDF + logistic regression baseline, a reference row
    tuned: str | None = None       # make compare-tuned: the tuned config file (null: <reports_dir>/tune/best.yaml)

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


@dataclass(frozen=True)
class TuneConfig:
    """``make tune``: the Optuna study over ``space`` (a YAML search space), its budget and its storage.

    ``trials`` counts every finished trial of the study (complete, pruned or failed) across all processes
    sharing it; ``max_minutes`` bounds one ``make tune`` run. ``storage``: any database URL Optuna accepts
    (``postgresql://...`` for a team); empty means ``optuna.db`` beside a SQLite tracking store.
    ``max_train_samples`` caps each trial's training rows (quick studies; the comparison uses them all).
    """

    space: str = "configs/tune.yaml"
    trials: int | None = 40
    max_minutes: float | None = 90.0
    storage: str | None = None
    study_name: str = "imdb-sentiment"
    seed: int = 0
    pruner_startup_trials: int = 5
    pruner_warmup_epochs: int = 0
    max_train_samples: int | None = None
    heartbeat_seconds: int = 30    # a trial silent for twice this is failed (a killed process's trial)
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

    master: str = "local[*]"
    conf: tuple[str, ...] | None = None
    output_format: str = "parquet"
    batch_rows: int = 2048

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


@dataclass(frozen=True)
class Config:
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    pseudo_label: PseudoLabelConfig = field(default_factory=PseudoLabelConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)

    @property
    def data_dir(self) -> Path:
        return Path(self.paths.data_dir)

    @property
    def reports_dir(self) -> Path:
        return Path(self.paths.reports_dir)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def backbone(self) -> dict:
        """The ``model`` keys that shape the encoder backbone (what pretraining depends on); the n-gram keys
        only when n-grams are on, so a tokens-only backbone keeps the hash it had before they existed."""
        keys = BACKBONE_KEYS + (NGRAM_KEYS if self.model.ngram_max > 1 else ())
        return {key: getattr(self.model, key) for key in keys}

    def section_hash(self, *sections: str) -> str:
        """Stable hash of the named sections: a stage reruns only when what it reads changed.

        The keys added for n-grams are left out while nothing uses n-grams (``model.ngram_max`` 1 and no
        ``compare.ngrams`` level above 1 among the hashed sections), and the preset keys while ``model.preset`` is
        unset, so a run or comparison recorded before they existed keeps its hash and an upgrade reruns nothing."""
        payload = {name: dataclasses.asdict(getattr(self, name)) for name in sections}
        compared = "compare" in sections and any(level > 1 for level in self.compare.ngrams or ())
        if "model" in payload and self.model.ngram_max == 1 and not compared:
            for key in NGRAM_KEYS:
                del payload["model"][key]
        if "model" in payload and self.model.preset is None:  # likewise the preset keys while no preset is used
            for key in PRESET_KEYS:
                del payload["model"][key]
        if "compare" in payload and self.compare.ngrams is None:
            del payload["compare"]["ngrams"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:16]

    def with_settings(self, settings: Iterable[tuple[str, Any]]) -> "Config":
        """A copy with ``section.key`` settings applied in order (a later one wins)."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in settings:
            section, key = name.split(".", 1)
            changes.setdefault(section, {})[key] = value
        return self.replace(**changes)

    def replace(self, **section_changes: Mapping[str, Any]) -> "Config":
        """A copy with some keys of some sections changed, e.g. ``replace(model={"pooling": "mean"})``."""
        raw = self.to_dict()
        for section, changes in section_changes.items():
            raw[section].update(changes)
        return build_sections(Config, raw, source="<replace>")


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse ``section.key=value``; the value is read as YAML (``3``, ``0.1``, ``null``, ``[1, 2]``)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    dotted, value_text = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    return section, key, yaml.safe_load(value_text) if value_text.strip() else None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load ``path`` (or the defaults when None), apply ``overrides`` and validate everything."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise MissingInputError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    for text in overrides:
        section, key, value = parse_override(text)
        section_values = raw.setdefault(section, {}) or {}
        raw[section] = {**section_values, key: value}
        source = f"{source} (with --set overrides)" if "--set" not in source else source
    return build_sections(Config, raw, source)
