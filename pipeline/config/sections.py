"""The sections that say what is learned and how: the data and its splits, the tokenizer, the model, training,
masked-LM pretraining, pseudo-labels and the NBSVM baseline. Each is a frozen dataclass whose defaults are the
real run's and whose ``__post_init__`` refuses a bad value with a ``ConfigError`` naming the key."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import ConfigError

CANONICAL_IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
CANONICAL_IMDB_MD5 = "7c2ac02c03563afcf9b574c7e56c153a"


@dataclass(frozen=True)
class PathsConfig:
    """Where stage outputs and reports go (relative paths are relative to the working directory)."""

    data_dir: str = "data"  # every stage's outputs (`make DATA=folder` sets it); {config}: the config file's name
    reports_dir: str = "reports"  # comparison reports, run reports and plots


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

    source: str = "imdb"  # imdb (the aclImdb archive) or table (your CSV/TSV/Parquet)
    archive: str | None = None  # the IMDB archive or folder ($IMDB_ARCHIVE); none: data/raw/, else the download
    path: str | None = None  # tables: a file, a folder or a glob
    text_column: str = "text"  # tables: the column holding the text
    label_column: str = "label"  # tables: the column holding the label (two or more classes)
    split_column: str | None = None  # tables: a column of train/val/test; none: seeded stratified splits
    group_column: str | None = None  # tables: reviews of one group (e.g. one movie) stay on one side of train/val
    group_validation: bool = True  # IMDB: hold whole movies out for validation when the archive names them
    test_fraction: float = 0.2  # tables without a split column: the share held out for test
    archive_sha256: str | None = None  # the archive's expected checksum, when you have one
    unlabeled_archive: str | None = None  # train/unsup reviews when the archive lacks them ($IMDB_UNSUP_ARCHIVE)
    max_unlabeled: int | None = None  # at most this many unlabeled reviews are ingested (none: all)
    download_url: str = CANONICAL_IMDB_URL  # where the archive is downloaded from when none is given
    download_md5: str = CANONICAL_IMDB_MD5  # the downloaded archive's checksum
    validation_fraction: float = 0.1  # the share of the train rows held out for validation
    seed: int = 1337  # the splits' seed

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

    vocabulary_size: int = 20000  # WordPiece tokens learned on the training texts
    lowercase: bool = True  # fold case before learning and encoding
    min_frequency: int = 5  # words rarer than this are not learned (speeds learning ~4x)
    max_sequence_length: int = 256  # tokens a review is cut to (start and end included)
    truncation: str = "head_tail"  # keep the first head_tokens and the last (max_sequence_length - 1 - head_tokens)
    head_tokens: int = 64  # head_tail truncation: tokens kept from the start
    include_unlabeled: bool = True  # learn the vocabulary on the unlabeled reviews too, when ingested

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATION_STRATEGIES:
            raise ConfigError(f"tokenizer.truncation must be one of {TRUNCATION_STRATEGIES}, got {self.truncation!r}")
        if self.max_sequence_length < 2:
            raise ConfigError("tokenizer.max_sequence_length must be at least 2 ([CLS] plus one token)")
        if not 0 <= self.head_tokens <= self.max_sequence_length - 1:
            raise ConfigError(
                f"tokenizer.head_tokens must be between 0 and max_sequence_length - 1, got {self.head_tokens}"
            )
        if self.vocabulary_size < 10:
            raise ConfigError(f"tokenizer.vocabulary_size is too small: {self.vocabulary_size}")


POOLINGS = ("first_token", "mean")
LONG_REVIEWS = ("truncate", "windows")
POSITIONS = ("learned", "sinusoidal", "none")
INITS = ("scratch", "pretrained")
BACKBONE_KEYS = ("position", "hidden_dim", "num_layers", "num_heads", "intermediate_dim", "dropout")
NGRAM_KEYS = ("ngram_max", "ngram_buckets", "ngram_dropout")
PRESET_KEYS = ("preset", "preset_max_parameters_on_cpu")


@dataclass(frozen=True)
class ModelConfig:
    """Transformer encoder classifier shape."""

    pooling: str = "first_token"  # first_token ([CLS]) or mean (masked mean of the token vectors)
    position: str = "learned"  # learned, sinusoidal or none
    hidden_dim: int = 64  # the encoder's width
    num_layers: int = 1  # encoder blocks
    num_heads: int = 2  # attention heads per block
    intermediate_dim: int = 128  # the feed-forward width
    dropout: float = 0.2  # dropout inside the encoder
    classifier_dropout: float = 0.3  # dropout before the classifier head
    init: str = "scratch"  # scratch | pretrained (`make pretrain`'s backbone; worse here: docs/results.md)
    pretrained: str | None = None  # a pretrain output folder or runs:/<run_id>/backbone; default data/pretrain
    ngram_max: int = 3  # 1: tokens alone; 3: + hashed 2- and 3-grams (significantly better: docs/results.md)
    ngram_buckets: int = 262_144  # rows of the hashed n-gram table shared by every n (2^18)
    ngram_dropout: float = 0.3  # drop whole n-gram vectors while training (without: over-fits, docs/results.md)
    # A pretrained KerasHub encoder to fine-tune instead (a preset name, or a folder save_to_preset wrote): its own
    # tokenizer and backbone, the pipeline's pooling and head; the shape keys above then do not apply
    preset: str | None = None
    preset_max_parameters_on_cpu: int = 25_000_000  # refuse a larger preset without a GPU (all-MiniLM-L6-v2: 22.7 M)
    # How the trained model reads a review longer than tokenizer.max_sequence_length when it scores (training always
    # reads the tokenize stage's head+tail rows): truncate (that row alone) | windows (that row and rows of
    # consecutive tokens covering the whole review, their log-probabilities averaged; docs/results.md)
    long_reviews: str = "truncate"

    def backbone(self) -> dict:
        """The keys that shape the encoder backbone (what pretraining depends on); the n-gram keys only when n-grams
        are on, so a tokens-only backbone keeps the hash it had before they existed."""
        keys = BACKBONE_KEYS + (NGRAM_KEYS if self.ngram_max > 1 else ())
        return {key: getattr(self, key) for key in keys}

    @property
    def starts_pretrained(self) -> bool:
        """Whether the encoder starts from pretrained weights (`make pretrain`'s backbone or a preset's)."""
        return self.init == "pretrained" or self.preset is not None

    def __post_init__(self) -> None:
        if self.init not in INITS:
            raise ConfigError(f"model.init must be one of {INITS}, got {self.init!r}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"model.pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.long_reviews not in LONG_REVIEWS:
            raise ConfigError(f"model.long_reviews must be one of {LONG_REVIEWS}, got {self.long_reviews!r}")
        if self.long_reviews == "windows" and self.preset is not None:
            raise ConfigError(
                "model.long_reviews=windows reads reviews with the pipeline's own tokenizer; a model.preset "
                "reads each review's head and tail: set model.long_reviews=truncate"
            )
        if self.position not in POSITIONS:
            raise ConfigError(f"model.position must be one of {POSITIONS}, got {self.position!r}")
        if self.hidden_dim % self.num_heads:
            raise ConfigError(
                f"model.hidden_dim ({self.hidden_dim}) must be divisible by model.num_heads ({self.num_heads})"
            )
        if not 1 <= self.ngram_max <= 8:
            raise ConfigError(f"model.ngram_max must be between 1 (tokens only) and 8, got {self.ngram_max}")
        if not 2 <= self.ngram_buckets <= 2**28:  # the int32 hash of pipeline.model.transformer.hashed_ngram_ids
            raise ConfigError(f"model.ngram_buckets must be 2 to 268,435,456 (2^28), got {self.ngram_buckets:,}")
        for name in ("dropout", "classifier_dropout", "ngram_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1)")
        if self.preset is not None:
            if not self.preset.strip():
                raise ConfigError("model.preset must name a KerasHub preset or a preset folder (or be null)")
            own = {"init": ("scratch", "masked-LM pretraining"), "ngram_max": (1, "hashed n-grams")}
            for key, (plain, what) in own.items():
                if getattr(self, key) != plain:
                    raise ConfigError(
                        f"model.{key} must be {plain} with model.preset ({what}: for the pipeline's "
                        f"own encoder only); set model.{key}={plain}"
                    )


PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")


@dataclass(frozen=True)
class TrainingConfig:
    """Optimiser, schedule, budget and hardware policy."""

    batch_size: int = 64  # reviews per step
    epochs: int = 2  # with distillation's 10,000 extra rows, the time 3 epochs without it took (docs/results.md)
    learning_rate: float = 1e-3  # the peak rate of the warmup-then-cosine schedule
    weight_decay: float = 0.01  # AdamW's decoupled weight decay
    warmup_fraction: float = 0.1  # the share of steps the rate warms up over
    early_stopping_patience: int = 1  # epochs without a better validation loss before stopping
    seed: int = 42  # the training seed (compare.seeds overrides it per run)
    precision: str = "auto"  # float32 on CPU below width 256, mixed_bfloat16 above (bf16 CPUs), mixed_float16 on GPU
    max_train_samples: int | None = None  # train on at most this many labelled rows (none: all)
    length_multiple: int = 16  # batches are trimmed to their longest review rounded up to this
    class_weights: bool = False  # weigh classes by their inverse frequency
    fine_tune_learning_rate: float = (  # a preset's backbone: the rate after the head's first epoch
        1e-3  # instead of learning_rate when model.init is pretrained (3e-4 was worse: docs/results.md)
    )
    fine_tune_warmup_fraction: float = 0.1  # a preset's backbone: the warmup share of that phase
    # distillation: also train on pseudo_label.max_rows unlabeled reviews with the teacher's probabilities
    # (significantly better: docs/results.md); made first when missing; off by itself when nothing is unlabeled
    pseudo_labels: bool = True
    freeze_backbone_epochs: int = 0  # model.preset: train the new head alone first, the pretrained backbone frozen
    # Embedding rows a batch did not read keep their weights and moments (pipeline.model.optimizers.LazyAdamW): the
    # n-gram table's dense AdamW update was most of a CPU step (the epoch times and accuracies: docs/throughput.md)
    sparse_updates: bool = True
    # adversarial training (Miyato et al. 2017): also the loss of every review with its normalised embeddings moved
    # this far along the loss gradient (pipeline.model.adversarial); 0: off. The pipeline's own encoder only
    adversarial_epsilon: float = 0.0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"training.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.batch_size < 1 or self.epochs < 1 or self.length_multiple < 1:
            raise ConfigError("training.batch_size, training.epochs and training.length_multiple must be positive")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError("training.warmup_fraction must be in [0, 1)")
        if self.adversarial_epsilon < 0:
            raise ConfigError(
                f"training.adversarial_epsilon must be 0 (off) or positive, got {self.adversarial_epsilon}"
            )
        if not 0 <= self.freeze_backbone_epochs < self.epochs:
            raise ConfigError(
                f"training.freeze_backbone_epochs must be at least 0 and below training.epochs "
                f"({self.epochs}), got {self.freeze_backbone_epochs}"
            )
        if self.pseudo_labels and self.max_train_samples:
            # the teacher is fitted on the whole train split: its labels would carry the gold labels left out
            raise ConfigError(
                "training.pseudo_labels and training.max_train_samples cannot be combined: the "
                "pseudo-label teacher is fitted on the whole train split; set "
                "training.pseudo_labels=false with training.max_train_samples"
            )


@dataclass(frozen=True)
class PretrainConfig:
    """Masked-language-model pretraining of the ``model`` section's encoder on train + unlabeled reviews.

    The budget is ``max_minutes`` of training time and/or ``max_steps``, whichever ends first;
    metrics are logged and a checkpoint is written every ``log_every_steps`` steps.
    """

    max_minutes: float | None = None  # stop after this many minutes of training or max_steps, whichever is first
    max_steps: int | None = 1500  # about 15 minutes on 2 CPU cores; steps, not minutes: the same on any machine
    batch_size: int = 64  # texts per masked-LM step
    learning_rate: float = 5e-4  # the masked-LM peak rate
    warmup_steps: int = 300  # steps the rate warms up over
    weight_decay: float = 0.01  # AdamW's decoupled weight decay
    mask_rate: float = 0.15  # the share of tokens masked
    log_every_steps: int = 100  # a loss line and MLflow metric every this many steps
    max_texts: int | None = None  # pretrain on at most this many texts (none: all)
    seed: int = 0  # the masking and shuffling seed
    precision: str = "auto"  # auto, float32, mixed_bfloat16 or mixed_float16
    snapshot_minutes: tuple[float, ...] | None = None  # also keep the backbone as it was after these minutes

    def __post_init__(self) -> None:
        if self.max_minutes is None and self.max_steps is None:
            raise ConfigError("pretrain needs a budget: pretrain.max_minutes and/or pretrain.max_steps")
        if (self.max_minutes is not None and self.max_minutes <= 0) or (
            self.max_steps is not None and self.max_steps < 1
        ):
            raise ConfigError("pretrain.max_minutes and pretrain.max_steps must be positive")
        if not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"pretrain.mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.batch_size < 1 or self.log_every_steps < 1:
            raise ConfigError("pretrain.batch_size and pretrain.log_every_steps must be positive")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"pretrain.precision must be one of {PRECISIONS}, got {self.precision!r}")


PSEUDO_LABEL_TEACHERS = ("nbsvm", "tfidf")
MODEL_URI_PREFIXES = ("models:/", "runs:/")


def is_model_uri(value: str) -> bool:
    """Whether ``value`` names a logged model rather than a teacher to fit: ``models:/NAME@ALIAS``,
    ``runs:/RUN_ID/model`` or a folder (a path holding ``/``)."""
    return value.startswith(MODEL_URI_PREFIXES) or "/" in value


@dataclass(frozen=True)
class PseudoLabelConfig:
    """``make pseudo-label``: self-training data from the unlabeled reviews.

    The teacher (``nbsvm``: the comparison's NBSVM baseline on reviews alone, without its crops; ``tfidf``:
    TF-IDF + logistic regression; both fitted on the train split only; or a model this pipeline logged, by its URI:
    ``models:/NAME@champion``, ``runs:/RUN_ID/model`` or a folder, loaded as it is) labels every unlabeled review;
    those whose top-class probability is at least ``min_confidence`` join the training set when
    ``training.pseudo_labels`` is on: as their most likely class, or with ``soft`` as the teacher's probabilities
    (distillation). ``max_rows`` keeps a random sample of that many of them (seeded by ``seed``), for a training time
    that fits a budget: each pseudo-labelled row costs what a labelled one does.
    """

    teacher: str = "nbsvm"  # nbsvm or tfidf (fitted on train), or a logged model's URI
    min_confidence: float = 0.5  # with two classes 0.5 keeps every review (docs/results.md)
    soft: bool = True  # train on the teacher's probabilities, not its hard labels
    max_rows: int | None = 10_000  # null: every review that passes min_confidence (50,000 for IMDB; configs/gpu.yaml)
    seed: int = 1337  # the TF-IDF teacher, which sure reviews are kept, the crops
    # short texts for the Transformer: this many random 1-2-sentence crops of every train review join the distilled
    # rows (0: none), each with a soft target, crop_label_weight on its review's label and the rest a cross-fitted
    # NBSVM's probability (pipeline.lexical.cross_fitted_teacher). Off: the crops help the Transformer alone, but
    # validation then gives it no weight in the fusion (docs/results.md)
    crops_per_review: int = 0
    crop_label_weight: float = 0.5  # a crop's soft target: this much of its review's label, the rest the teacher's

    def __post_init__(self) -> None:
        if self.teacher not in PSEUDO_LABEL_TEACHERS and not is_model_uri(self.teacher):
            raise ConfigError(
                f"pseudo_label.teacher must be one of {PSEUDO_LABEL_TEACHERS} or a model URI "
                f"(models:/NAME@ALIAS, runs:/RUN_ID/model or a model folder), got {self.teacher!r}"
            )
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ConfigError(f"pseudo_label.min_confidence must be in [0, 1], got {self.min_confidence}")
        if self.crops_per_review < 0 or not 0.0 <= self.crop_label_weight <= 1.0:
            raise ConfigError(
                "pseudo_label.crops_per_review must be 0 or more and pseudo_label.crop_label_weight in "
                f"[0, 1], got {self.crops_per_review} and {self.crop_label_weight}"
            )
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"pseudo_label.max_rows must be positive or null (every row), got {self.max_rows}")


@dataclass(frozen=True)
class NbsvmConfig:
    """NBSVM, the lexical candidate and the fusions' other half (``pipeline.lexical``): its n-grams, its crops and the
    ``C`` values validation chooses from. Written ``baseline`` (and ``nbsvm_c``) before 2026-12: still read."""

    c_values: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0)  # the regularisation strengths tried, chosen on validation
    ngram_max: int = 3  # the longest n-gram counted
    max_features: int = 800_000  # the most frequent n-grams kept
    seed: int = 0  # the fit's and its crops' seed
    # also train on this many random 1-2-sentence crops of every training review (short texts; 0: reviews only), each
    # with a soft label: crop_label_weight on its review's label, the rest a cross-fitted NBSVM's probability
    # (4: significantly better on short texts and reviews, alone and fused: docs/results.md)
    crops_per_review: int = 4
    crop_label_weight: float = 0.5  # a crop's target: this much of its review's label, the rest a cross-fitted NBSVM's
    # and this many crops of each unlabeled review (the ingestion's, e.g. IMDB's 50,000; none: skipped), each labelled
    # with the class NBSVM fitted on every train review gives its whole review, mixed the same way with that model's
    # probability on the crop (4 is significantly better than none and than 2: docs/results.md)
    unlabeled_crops_per_review: int = 4

    def __post_init__(self) -> None:
        if self.crops_per_review < 0:
            raise ConfigError(f"nbsvm.crops_per_review must be 0 (reviews only) or more, got {self.crops_per_review}")
        if self.unlabeled_crops_per_review < 0:
            raise ConfigError(
                f"nbsvm.unlabeled_crops_per_review must be 0 (none) or more, got {self.unlabeled_crops_per_review}"
            )
        if not 0.0 <= self.crop_label_weight <= 1.0:
            raise ConfigError(f"nbsvm.crop_label_weight must be in [0, 1], got {self.crop_label_weight}")
        if any(c <= 0 for c in self.c_values):
            raise ConfigError(f"nbsvm.c_values must be positive, got {list(self.c_values)}")
        if self.ngram_max < 1 or self.max_features < 1:
            raise ConfigError("nbsvm.ngram_max and nbsvm.max_features must be positive")
