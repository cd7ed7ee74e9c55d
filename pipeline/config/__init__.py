"""Typed, frozen configuration loaded from YAML and validated on load.

One dataclass per concern: what is learned and how (paths, data, tokenizer, model, training, pretrain,
pseudo_label, nbsvm: ``pipeline.config.sections``) and how runs are carried out (tracking, compare, tune,
spark: ``pipeline.config.runs``); every name is importable from ``pipeline.config``.
``load_config(path, overrides)`` reads a YAML file, applies ``section.key=value`` overrides and returns a frozen
:class:`Config`. Unknown sections or keys and wrongly typed values raise ``ConfigError`` naming the key and the
file, so a typo never silently falls back to a default. Old names still read (``RENAMED_SECTIONS``,
``RENAMED_KEYS``); a retired setting (``RETIRED_KEYS``) reads only at the value that does what today's code does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.runs import (
    COMPARE_FACTORS,
    SPARK_OUTPUT_FORMATS,
    CompareConfig,
    SparkConfig,
    TrackingConfig,
    TuneConfig,
)
from pipeline.config.sections import (
    BACKBONE_KEYS,
    CANONICAL_IMDB_MD5,
    CANONICAL_IMDB_URL,
    DATA_SOURCES,
    INITS,
    LONG_REVIEWS,
    NGRAM_KEYS,
    POOLINGS,
    POSITIONS,
    PRECISIONS,
    PRESET_KEYS,
    PSEUDO_LABEL_TEACHERS,
    TRUNCATION_STRATEGIES,
    DataConfig,
    ModelConfig,
    NbsvmConfig,
    PathsConfig,
    PretrainConfig,
    PseudoLabelConfig,
    TokenizerConfig,
    TrainingConfig,
)
from pipeline.config.typed_values import build_sections
from pipeline.core.errors import ConfigError, MissingInputError

__all__ = [
    "BACKBONE_KEYS",
    "CANONICAL_IMDB_MD5",
    "CANONICAL_IMDB_URL",
    "COMPARE_FACTORS",
    "DATA_SOURCES",
    "INITS",
    "LONG_REVIEWS",
    "NGRAM_KEYS",
    "POOLINGS",
    "POSITIONS",
    "PRECISIONS",
    "PRESET_KEYS",
    "PSEUDO_LABEL_TEACHERS",
    "SPARK_OUTPUT_FORMATS",
    "TRUNCATION_STRATEGIES",
    "NbsvmConfig",
    "CompareConfig",
    "Config",
    "DataConfig",
    "ModelConfig",
    "PathsConfig",
    "PretrainConfig",
    "PseudoLabelConfig",
    "SparkConfig",
    "TokenizerConfig",
    "TrackingConfig",
    "TrainingConfig",
    "TuneConfig",
    "load_config",
    "parse_override",
]

# Keys added after runs were recorded -> the value that does what the config did without them: left out of
# ``Config.section_hash`` while they hold it.
ADDED_KEYS = {
    ("compare", "ngrams"): None,
    ("compare", "sparse_updates"): None,
    ("compare", "adversarial_epsilons"): None,
    ("pseudo_label", "max_rows"): None,
    ("training", "sparse_updates"): False,
    ("training", "adversarial_epsilon"): 0.0,
    ("model", "long_reviews"): "truncate",
    ("compare", "long_reviews"): None,
    ("compare", "short_fusion_words"): 0,
    ("nbsvm", "unlabeled_crops_per_review"): 0,
    ("model", "preset_blocks"): None,  # retired since (RETIRED_KEYS); never hashed
    ("compare", "cascade_share"): 1.0,
}


@dataclass(frozen=True)
class Retired:
    """A setting that was measured, did not pay, and was removed (one line in ``docs/results.md`` or its history)."""

    value: Any  # what every run without the setting did: still read (and ignored), and hashed as it was
    why: str  # what the measurement found, and where it is written up
    kept: tuple[Any, ...] = ()  # other values meaning the same as ``value``


# Settings retired after runs were recorded -> why. A config file (an old default.yaml, a tune's best.yaml) or
# ``--set`` that gives one its ``value`` still loads; any other value is a ``ConfigError`` naming the key. A section's
# hash is computed with the key at that value, so a run recorded before it was retired is reused, not rerun.
RETIRED_KEYS = {
    ("model", "token_embedding"): Retired(
        "random", "word2vec token vectors gained +0.15 points, not significant: docs/results.md"
    ),
    ("compare", "token_embeddings"): Retired(
        None,
        "it compared word2vec token vectors, which gained +0.15 points, not significant: docs/results.md",
        kept=(["random"],),
    ),
    ("model", "preset_blocks"): Retired(
        None, "fewer of a preset's blocks lost accuracy on every seed: docs/history/short-texts.md#fewer-blocks"
    ),
}

# Names a config file or ``--set`` may still use -> today's: read as the new name (both at once is an error). A
# section's hash is computed under its old names, so a run recorded before a rename is reused, not rerun.
RENAMED_SECTIONS = {"baseline": "nbsvm"}
RENAMED_KEYS = {("nbsvm", "nbsvm_c"): "c_values"}
HASHED_AS = {new: old for old, new in RENAMED_SECTIONS.items()}  # the section names a hash is computed under


def current_key(section: str, key: str) -> str:
    """Today's name of ``key`` in today's ``section`` (itself unless it was renamed)."""
    return RENAMED_KEYS.get((section, key), key)


def is_retired(section: str, key: str, value: Any, where: str, remedy: str) -> bool:
    """Whether ``section.key`` is a retired setting at its old value (to be left out: it means what the config means
    without it); at any other value a retired setting is a ``ConfigError`` naming it and saying ``remedy``."""
    retired = RETIRED_KEYS.get((section, key))
    if retired is None:
        return False
    if value == retired.value or value in retired.kept:
        return True
    raise ConfigError(f"{where}: {section}.{key} was retired ({retired.why}); {remedy}")


def without_retired(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """``raw`` (a YAML file's sections, today's names) without the retired settings that hold their old value."""
    out: dict[str, Any] = {}
    for section, values in raw.items():
        if isinstance(values, dict):
            remedy = f"remove it from {source}"
            values = {
                key: value for key, value in values.items() if not is_retired(section, key, value, source, remedy)
            }
        out[section] = values
    return out


def with_new_names(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """``raw`` (a YAML file's sections) with old section and key names replaced by today's."""
    out: dict[str, Any] = {}
    for name, values in raw.items():
        section = RENAMED_SECTIONS.get(name, name)
        if section in out:
            raise ConfigError(
                f"{source}: sets both {section!r} and its old name {HASHED_AS[section]!r}; keep one of them"
            )
        out[section] = values
        if isinstance(values, dict):
            keys = [current_key(section, key) for key in values]
            if len(set(keys)) < len(keys):
                raise ConfigError(f"{source}: {section} holds a key under its old and its new name; keep one")
            out[section] = dict(zip(keys, values.values()))
    return out


@dataclass(frozen=True)
class Config:
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    pseudo_label: PseudoLabelConfig = field(default_factory=PseudoLabelConfig)
    nbsvm: NbsvmConfig = field(default_factory=NbsvmConfig)
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

    def section_hash(self, *sections: str) -> str:
        """Stable hash of the named sections: a stage reruns only when what it reads changed.

        The keys added for n-grams are left out while nothing uses n-grams (``model.ngram_max`` 1 and no
        ``compare.ngrams`` level above 1 among the hashed sections), and the preset keys while ``model.preset`` is
        unset, and every key of ``ADDED_KEYS`` while it holds the value that does what the config did before the key
        existed, so a run or comparison recorded before they existed keeps its hash and an upgrade reruns nothing. A
        key of ``RETIRED_KEYS`` counts at the value every run had, as it did before it was retired."""
        payload = {name: dataclasses.asdict(getattr(self, name)) for name in sections}
        compared = "compare" in sections and any(level > 1 for level in self.compare.ngrams or ())
        if "model" in payload and self.model.ngram_max == 1 and not compared:
            for key in NGRAM_KEYS:
                del payload["model"][key]
        if "model" in payload and self.model.preset is None:  # likewise the preset keys while no preset is used
            for key in PRESET_KEYS:
                del payload["model"][key]
        for (section, key), retired in RETIRED_KEYS.items():  # as the code before hashed it (ADDED_KEYS: not at all)
            if section in payload:
                payload[section][key] = retired.value
        for (section, key), before in ADDED_KEYS.items():  # at the value that means what the config meant before it
            if section in payload and payload[section].get(key, before) == before:
                payload[section].pop(key, None)  # (a preset key is gone already while no preset is used)
        for (section, old), new in RENAMED_KEYS.items():  # hashed under the names runs were first recorded with
            if section in payload:
                payload[section][old] = payload[section].pop(new)
        payload = {HASHED_AS.get(name, name): values for name, values in payload.items()}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=list).encode()).hexdigest()[:16]

    def with_settings(self, settings: Iterable[tuple[str, Any]]) -> Config:
        """A copy with ``section.key`` settings applied in order (a later one wins)."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in settings:
            section, key = name.split(".", 1)
            changes.setdefault(section, {})[key] = value
        return self.replace(**changes)

    def replace(self, **section_changes: Mapping[str, Any]) -> Config:
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
    section = RENAMED_SECTIONS.get(section, section)
    key = current_key(section, key)
    return section, key, yaml.safe_load(value_text) if value_text.strip() else None


CONFIG_NAME = "{config}"  # in a config file's paths and tracking names: the file's name without .yaml
NAMED_SECTIONS = ("paths", "tracking")


def with_config_name(raw: dict[str, Any], stem: str) -> dict[str, Any]:
    """``raw`` with ``{config}`` in its ``paths`` and ``tracking`` strings replaced by ``stem`` (the file's name):
    a config copied to another name writes its own folders and registers its own model."""

    def named(values):
        if not isinstance(values, dict):
            return values
        return {k: v.replace(CONFIG_NAME, stem) if isinstance(v, str) else v for k, v in values.items()}

    return {section: named(values) if section in NAMED_SECTIONS else values for section, values in raw.items()}


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
        raw = with_config_name(without_retired(with_new_names(raw, source), source), path.stem)
    for text in overrides:
        section, key, value = parse_override(text)
        if is_retired(section, key, value, f"--set {text}", "leave that --set out"):
            continue
        section_values = raw.setdefault(section, {}) or {}
        raw[section] = {**section_values, key: value}
        source = f"{source} (with --set overrides)" if "--set" not in source else source
    return build_sections(Config, raw, source)
