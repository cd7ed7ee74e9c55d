"""What a comparison varies: its :class:`Design` (factors, fixed settings, report name) and its variants.

``make compare``'s design comes from the config's ``compare`` section (:func:`main_design`); the
experiments' designs are data, ``designs.yaml`` beside this module (:func:`design_for`). The ``tuned``
design's levels are whole configurations: ``tuned`` is the file ``make tune`` wrote, ``default`` this
config (:func:`tuned_design`). Pure functions of the config, apart from reading those two files.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import BACKBONE_KEYS, COMPARE_FACTORS, CompareConfig, Config, load_config
from pipeline.core.errors import ConfigError, MissingInputError

DESIGNS_FILE = Path(__file__).with_name("designs.yaml")
MAIN = "main"
DESIGN_NAMES = (MAIN, "position", "tuned")
# a factor with this key sets a whole configuration: each level's ``section.key`` settings (``Design.overlays``)
TUNED_FACTOR = "config"
TUNED_SECTIONS = ("tokenizer", "model", "training")  # what the tuned level may change; seeds stay the comparison's


@dataclass(frozen=True)
class Design:
    """A comparison: the keys it varies (one or two factors, two levels each, the first called A), the
    settings it holds fixed for every variant, the report's file name, and whether its runs are
    candidates for `make register` (an ablation's are not). Keys are ``section.key``."""

    factors: tuple[tuple[str, tuple[Any, Any]], ...]
    report_name: str
    champion_pool: bool
    fixed: tuple[tuple[str, Any], ...] = ()
    # a factor whose key is TUNED_FACTOR sets a whole configuration: each level's ``section.key`` settings
    overlays: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def settings(self, variant: dict[str, Any]) -> list[tuple[str, Any]]:
        """The ``section.key`` settings of one variant: its levels, a configuration factor's level expanded."""
        overlays = dict(self.overlays)
        settings: list[tuple[str, Any]] = []
        for key, value in variant.items():
            settings.extend(overlays[value] if key == TUNED_FACTOR else [(key, value)])
        return settings


def main_design(compare: CompareConfig) -> Design:
    """``make compare``'s design: the compare keys with two levels vary, those with one are fixed, empty ones
    keep the configured value."""
    levels = {key: tuple(getattr(compare, key) or ()) for key in COMPARE_FACTORS}
    factors = tuple((COMPARE_FACTORS[key][0], values) for key, values in levels.items() if len(values) == 2)
    fixed = tuple((COMPARE_FACTORS[key][0], values[0]) for key, values in levels.items() if len(values) == 1)
    return Design(factors, "comparison", champion_pool=True, fixed=fixed)


@cache
def declared_designs() -> dict[str, dict]:
    """``designs.yaml``: name -> {report, champion_pool, factors}."""
    return yaml.safe_load(DESIGNS_FILE.read_text())


def design_for(config: Config, name: str = MAIN) -> Design:
    """The design called ``name``: ``main`` from the compare section, the others from ``designs.yaml``."""
    if name not in DESIGN_NAMES:
        raise ConfigError(f"unknown design {name!r} (known: {', '.join(DESIGN_NAMES)})")
    if name == MAIN:
        return main_design(config.compare)
    declared = declared_designs()[name]
    factors = tuple((key, tuple(levels)) for key, levels in declared["factors"].items())
    if any(key == TUNED_FACTOR for key, _ in factors):
        return tuned_design(config, factors, declared)
    return Design(factors, declared["report"], champion_pool=declared["champion_pool"])


def tuned_path(config: Config) -> Path:
    return Path(config.compare.tuned) if config.compare.tuned else config.reports_dir / "tune" / "best.yaml"


def tuned_design(config: Config, factors, declared: dict) -> Design:
    """One factor, ``config``: ``default`` is this config with the compare section's single levels (its
    two-level factors do not apply: each level keeps its own pooling, say); ``tuned`` is the tuned config
    file's tokenizer, model and training sections (the seed excepted: seeds are the comparison's), set
    over those where they differ."""
    path = tuned_path(config)
    if not path.is_file():
        raise MissingInputError(
            f"compare.tuned: no tuned config at {path}: run `make tune` first, or point compare.tuned at a config file"
        )
    tuned = load_config(path)
    fixed = main_design(config.compare).fixed
    default = config.with_settings(fixed)  # the default level: this config with the compare section's single levels
    overlay = tuple(
        (f"{section}.{key}", value)
        for section in TUNED_SECTIONS
        for key, value in dataclasses.asdict(getattr(tuned, section)).items()
        if key != "seed" and value != getattr(getattr(default, section), key)
    )
    if not overlay:
        raise ConfigError(f"{path}: its {', '.join(TUNED_SECTIONS)} settings are this config's: nothing to compare")
    tuned_level = default.with_settings(overlay)
    shape = {f"model.{key}" for key in BACKBONE_KEYS if key != "dropout"} | {
        f"tokenizer.{key}"
        for key in ("vocabulary_size", "lowercase", "min_frequency", "include_unlabeled", "max_sequence_length")
    }  # what the backbone's weights are built for
    backbone_changed = [key for key, _ in overlay if key in shape]
    if "pretrained" in (default.model.init, tuned_level.model.init) and backbone_changed:
        raise ConfigError(
            f"{path}: the tuned level changes {', '.join(backbone_changed)}, which the masked-LM "
            "backbone is built for, and a level starts from it (model.init: pretrained); compare "
            "from scratch (compare.inits=[scratch]) or tune without those settings"
        )
    ((_, (tuned_name, default_name)),) = factors
    return Design(
        factors,
        declared["report"],
        champion_pool=declared["champion_pool"],
        fixed=fixed,
        overlays=((tuned_name, overlay), (default_name, ())),
    )


# --------------------------------------------------------------------------- variants and their names


def variants(design: Design) -> list[dict[str, Any]]:
    """Every combination of the design's factor levels, A levels first (keys ``section.key``)."""
    keys = [key for key, _ in design.factors]
    return [dict(zip(keys, values)) for values in itertools.product(*(levels for _, levels in design.factors))]


def level_name(key: str, value: Any) -> str:
    """``first_token`` for a text level; ``pseudo_labels=on`` for a switch; ``ngram_max=3`` for a number."""
    if isinstance(value, bool):
        return f"{key.rsplit('.', 1)[-1]}={'on' if value else 'off'}"
    if isinstance(value, (int, float)):
        return f"{key.rsplit('.', 1)[-1]}={value}"
    return str(value)


def setting_text(key: str, value: Any) -> str:
    """``init=scratch``; ``pseudo_labels=on``."""
    return level_name(key, value) if isinstance(value, bool) else f"{key.rsplit('.', 1)[-1]}={value}"


def variant_name(variant: dict[str, Any]) -> str:
    """``first_token/scratch`` for two factors; the bare level (``mean``) for one; ``transformer`` for none."""
    return "/".join(level_name(key, value) for key, value in variant.items()) or "transformer"


def variant_config(config: Config, design: Design, variant: dict[str, Any], seed: int) -> Config:
    """The config of one variant and seed: the design's fixed settings and this variant's levels (a configuration
    factor's level expanded into its settings)."""
    return config.with_settings([("training.seed", seed), *design.fixed, *design.settings(variant)])
