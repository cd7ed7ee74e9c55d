"""``make tune``: an Optuna study over the settings declared in ``configs/tune.yaml``, every trial an MLflow run.

Reads:  the search space (``tune.space``, default ``configs/tune.yaml``: each ``section.key`` with a range
        ``{low, high, log}`` or ``{choices: [...]}``), ``data/ingest/`` and ``data/tokenize/`` (a trial that
        changes the tokenizer gets its own tokenization, ``data/tune/tokenize-<hash>/``).
Writes: the study in Optuna storage (``tune.storage``; default ``optuna.db`` beside the tracking store, or any
        database URL Optuna accepts), one MLflow parent run per study with a child per trial (its params,
        per-epoch curves, ``trial_state``), the best value and parameters and Optuna's plots on the parent;
        ``reports/tune/{best.yaml,trials.csv,summary.json,*.png}``.

A new study's first trial is the configured settings (``tune.start_from_config``): the bar the search has to
beat, measured by the same protocol. The sampler is TPE with ``tune.seed``; a median pruner stops a trial whose
validation loss after an epoch is worse than the median of earlier trials' at that epoch. The objective is the trial's
best validation accuracy: test is never read. ``best.yaml`` is the whole configuration with the best parameters in
place, so the tuned model goes through the same comparison as any other (``make compare CONFIG=reports/tune/best.yaml``)
and can become the champion only by that protocol: ``make compare-tuned`` runs it against the configured model, both
candidates of one comparison. A killed ``make tune`` resumes the same study (its interrupted trial
is failed by Optuna's heartbeat check); several ``make tune`` processes on one storage share the study.
"""

from __future__ import annotations

import dataclasses
import os
import time
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import yaml

from pipeline.config import Config, TrackingConfig
from pipeline.config.typed_values import check_type
from pipeline.core.catalog import MANIFEST_NAME, require_output
from pipeline.core.errors import ConfigError, InputError, MissingInputError, PipelineError
from pipeline.core.files import atomic_write_json, atomic_write_text, require_manifest
from pipeline.stages.tokenize.vocabulary import own_tokenization
from pipeline.stages.train.fit_and_log import train_model
from pipeline.tracking import flat_params, setup_tracking, tracking_uri

REPORT_DIR = "tune"
STUDY_TAG = "optuna_study"
TRIAL_TAG = "optuna_trial"
STATE_TAG = "trial_state"


@dataclass(frozen=True)
class Parameter:
    """One searched setting: ``section.key`` with a range (``low``..``high``, ``log`` scale) or ``choices``."""

    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple | None = None

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if isinstance(self.low, int) and isinstance(self.high, int):
            return trial.suggest_int(self.name, self.low, self.high, log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)


# --------------------------------------------------------------------------- the search space


def parse_space(raw: Any, config: Config, source: str) -> list[Parameter]:
    """The parameters of a search-space mapping, each checked against the config before any trial runs."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f"{source}: the search space must be a non-empty mapping of section.key to a range or choices"
        )
    sections = {f.name: typing.get_type_hints(type(getattr(config, f.name))) for f in dataclasses.fields(config)}
    parameters = []
    for name, spec in raw.items():
        where = f"{source}: {name}"
        section, _, key = str(name).partition(".")
        if section not in sections or key not in sections[section]:
            known = sorted(
                f"{s}.{k}" for s, hints in sections.items() if s not in ("paths", "tracking", "tune") for k in hints
            )
            raise ConfigError(f"{where}: unknown setting (known: {', '.join(known)})")
        if section in ("paths", "tracking", "tune"):
            raise ConfigError(f"{where}: {section} settings are not searched")
        if not isinstance(spec, dict) or not (set(spec) <= {"low", "high", "log", "choices"}):
            raise ConfigError(f"{where}: give {{low, high[, log]}} or {{choices: [...]}}, got {spec!r}")
        annotation = sections[section][key]
        if "choices" in spec:
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices or set(spec) != {"choices"}:
                raise ConfigError(f"{where}: choices must be a non-empty list (and alone), got {spec!r}")
            checked = tuple(check_type(choice, annotation, where) for choice in choices)
            for choice, value in zip(choices, checked):
                if type(choice) is not type(value) and not (isinstance(choice, int) and isinstance(value, float)):
                    raise ConfigError(f"{where}: choice {choice!r} is not of the setting's type")
            parameters.append(Parameter(name, choices=checked))
            continue
        if "low" not in spec or "high" not in spec:
            raise ConfigError(f"{where}: a range needs low and high, got {spec!r}")
        low, high = (check_type(spec[bound], annotation, f"{where}.{bound}") for bound in ("low", "high"))
        if isinstance(low, bool) or not isinstance(low, (int, float)):
            raise ConfigError(f"{where}: a range needs a numeric setting; use choices for {annotation}")
        if not low < high:
            raise ConfigError(f"{where}: empty range, low {low!r} must be below high {high!r}")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise ConfigError(f"{where}.log must be true or false, got {log!r}")
        if log and low <= 0:
            raise ConfigError(f"{where}: a log-scale range needs low > 0, got {low!r}")
        parameters.append(Parameter(name, low=low, high=high, log=log))
    return parameters


def load_space(config: Config) -> list[Parameter]:
    path = Path(config.tune.space)
    if not path.is_file():
        raise MissingInputError(f"tune.space: no search-space file {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_space(raw, config, str(path))


def trial_config(config: Config, values: dict[str, Any]) -> Config:
    """The config of one trial: ``values`` (``section.key`` -> value) set, the rest as configured. A trial capped by
    ``tune.max_train_samples`` trains without distillation: its teacher saw every train row."""
    cap = (
        [("training.max_train_samples", config.tune.max_train_samples), ("training.pseudo_labels", False)]
        if config.tune.max_train_samples
        else []
    )
    return config.with_settings([*cap, *values.items()])  # a searched cap wins over tune's


def configured_values(config: Config, parameters: list[Parameter]) -> dict[str, Any]:
    """The configured value of every searched setting that lies in its range or among its choices: the first
    trial of a new study, so the search starts from the configuration it has to beat (Optuna samples the rest)."""
    values = {}
    for parameter in parameters:
        section, key = parameter.name.split(".", 1)
        value = getattr(getattr(config, section), key)
        if parameter.choices is not None:
            inside = value in parameter.choices
        else:
            low, high = parameter.low, parameter.high
            if low is None or high is None:
                raise ValueError(f"{parameter.name}: a searched setting needs choices or a low..high range")
            inside = not isinstance(value, bool) and isinstance(value, (int, float)) and low <= value <= high
        if inside:
            values[parameter.name] = value
    return values


def configured_differs(config: Config, params: dict[str, Any]) -> bool:
    """Whether ``params`` set anything other than the configured values."""
    base = config.replace(tune={"max_train_samples": None})
    return trial_config(base, params) != base


def default_storage(config: Config) -> str:
    """``optuna.db`` beside a SQLite tracking store, else in the working folder."""
    if config.tune.storage:
        return config.tune.storage
    uri = tracking_uri(config.tracking)
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri[len('sqlite:///') :]).parent / 'optuna.db'}"
    return "sqlite:///optuna.db"


def open_storage(url: str, heartbeat_seconds: int = 30):
    """Optuna's storage at ``url``, with heartbeats so a killed trial is failed, not left running; a clear error
    naming the URL when it cannot be opened."""
    import optuna

    try:
        return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat_seconds, grace_period=2 * heartbeat_seconds)
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy raises many kinds; each means "cannot open"
        raise InputError(
            f"tune.storage: cannot open {url!r}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None


# --------------------------------------------------------------------------- one trial


def pruning_callback(trial):
    """A Keras callback reporting each epoch's negated validation loss to ``trial`` (the study maximises, so
    higher is better) and stopping training when the pruner says so."""
    import keras

    class ReportValidationLoss(keras.callbacks.Callback):
        pruned_at: int | None = None

        def on_epoch_end(self, epoch, logs=None):
            if logs and "val_loss" in logs:
                trial.report(-float(logs["val_loss"]), epoch)
                if trial.should_prune():
                    self.pruned_at = epoch
                    self.model.stop_training = True

    return ReportValidationLoss()


def run_trial(trial, base: Config, parameters: list[Parameter]) -> float:
    import optuna

    values = {parameter.name: parameter.suggest(trial) for parameter in parameters}
    config = own_tokenization(trial_config(base, values), base)  # a ConfigError here fails just this trial
    callback = pruning_callback(trial)
    started = time.perf_counter()
    run_dir = train_model(config, extra_callbacks=[callback]).run_dir
    manifest = require_manifest(run_dir)
    client = mlflow.tracking.MlflowClient()
    state = "pruned" if callback.pruned_at is not None else "complete"
    client.set_tag(manifest["mlflow_run_id"], TRIAL_TAG, str(trial.number))
    client.set_tag(manifest["mlflow_run_id"], STATE_TAG, state)
    trial.set_user_attr("mlflow_run_id", manifest["mlflow_run_id"])
    trial.set_user_attr("process", os.getpid())
    trial.set_user_attr("seconds", round(time.perf_counter() - started, 1))
    if callback.pruned_at is not None:
        # the run stopped early: it must not pass for a finished one if a later trial asks for the same settings
        (run_dir / MANIFEST_NAME).unlink(missing_ok=True)
        raise optuna.TrialPruned(f"pruned after epoch {callback.pruned_at + 1}")
    return float(manifest["best_val_accuracy"])


# --------------------------------------------------------------------------- reports


def save_plots(study, out_dir: Path) -> list[Path]:
    """Optuna's optimisation history, parameter importances and parallel coordinates (matplotlib, headless)."""
    from optuna.visualization import matplotlib as plots

    from pipeline.core.plots import save_figure

    made = []
    for name, draw in (
        ("optimization_history", plots.plot_optimization_history),
        ("param_importances", plots.plot_param_importances),
        ("parallel_coordinate", plots.plot_parallel_coordinate),
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                axes = draw(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:  # too few finished trials for this plot
            print(f"tune: no {name} plot yet ({exc})")
            continue
        axes = axes.flat[0] if hasattr(axes, "flat") else axes
        made.append(save_figure(axes.figure, out_dir / f"{name}.png"))
    return made


def best_overlay(config: Config, params: dict[str, Any], what: str = "the study's best parameters") -> str:
    """The whole configuration with the best parameters (or ``what`` else) in place, as YAML (for ``CONFIG=``)."""
    raw = trial_config(config.replace(tune={"max_train_samples": None}), params).to_dict()
    raw.pop("tune", None)
    header = (
        f"# Written by `make tune`: the configuration with {what} in place.\n"
        "# Run it through the comparison against the configured model: make compare-tuned\n"
        "# (or alone: make compare CONFIG=reports/tune/best.yaml)\n"
    )
    return header + yaml.safe_dump(raw, sort_keys=False)


def parent_run_id(tracking: TrackingConfig, study_name: str) -> str | None:
    runs = mlflow.search_runs(
        experiment_names=[tracking.experiment_name],
        output_format="list",
        filter_string=f"tags.`{STUDY_TAG}` = '{study_name}'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


# --------------------------------------------------------------------------- stage entry point


def open_study(config: Config, storage, parameters: list[Parameter]):
    """The configured study in ``storage``, created if new (first trial: the configured settings), stale ones failed."""
    import optuna

    settings = config.tune
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # tune.seed makes a new study repeatable; a process joining a study that has trials (a resume, a second
    # machine) draws its own seed, or two processes would propose the same parameters in lockstep
    known = {summary.study_name: summary.n_trials for summary in optuna.get_all_study_summaries(storage)}
    seed = settings.seed if not known.get(settings.study_name) else settings.seed + os.getpid()
    study = optuna.create_study(
        study_name=settings.study_name,
        storage=storage,
        direction="maximize",
        load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.MedianPruner(
            n_startup_trials=settings.pruner_startup_trials, n_warmup_steps=settings.pruner_warmup_epochs
        ),
    )
    optuna.storages.fail_stale_trials(study)
    if settings.start_from_config and not study.trials:
        study.enqueue_trial(configured_values(config, parameters), user_attrs={"configured": True}, skip_if_exists=True)
    return study


def print_progress(study, trial) -> None:
    """An Optuna callback: one line per finished trial, its state and value and the best so far."""
    import optuna

    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = f"{study.best_value:.4f}" if finished else "-"
    value = f"{trial.value:.4f}" if trial.state == optuna.trial.TrialState.COMPLETE else "-"  # pruned: no value
    what = " (the configured settings)" if trial.user_attrs.get("configured") else ""
    print(
        f"tune: trial {trial.number}{what} {trial.state.name.lower()}, value {value}, best so far {best}, "
        f"{trial.user_attrs.get('seconds', float('nan')):.0f}s",
        flush=True,
    )


def optimize(study, config: Config, parameters: list[Parameter], total: int | None) -> None:
    """Run trials until the study holds ``total`` finished ones (None: no cap) or ``tune.max_minutes`` pass."""
    import optuna

    callbacks = [print_progress]
    if total is not None:
        done_states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        callbacks.append(optuna.study.MaxTrialsCallback(total, states=done_states))
    remaining = None if total is None else max(0, total - len([t for t in study.trials if t.state in done_states]))
    if remaining != 0:
        study.optimize(
            lambda trial: run_trial(trial, config, parameters),
            n_trials=remaining,
            timeout=None if config.tune.max_minutes is None else 60 * config.tune.max_minutes,
            callbacks=callbacks,
            catch=(PipelineError,),
        )  # a user-fixable problem fails one trial


def write_study_reports(
    config: Config, study, best, states: dict[str, int], out_dir: Path, storage_url: str, parent_run_id: str
) -> Path:
    """Write ``best.yaml`` (from the ``best`` trial), ``trials.csv``, ``summary.json`` and the plots into ``out_dir``
    and log them, the best value and the trial counts to the active (parent) MLflow run; returns ``best.yaml``."""
    overlay = atomic_write_text(out_dir / "best.yaml", best_overlay(config, best.params))
    atomic_write_text(out_dir / "trials.csv", study.trials_dataframe().to_csv(index=False))
    summary = {
        "study": config.tune.study_name,
        "storage": storage_url,
        "states": states,
        "best_value": best.value,
        "best_trial": best.number,
        "best_params": best.params,
        "best_mlflow_run_id": best.user_attrs.get("mlflow_run_id"),
        "parent_run_id": parent_run_id,
    }
    atomic_write_json(out_dir / "summary.json", summary)
    mlflow.log_metrics(
        {
            "best_val_accuracy": best.value,
            "trials_complete": states["complete"],
            "trials_pruned": states["pruned"],
            "trials_failed": states["fail"],
        }
    )
    mlflow.set_tags({f"best.{name}": str(value) for name, value in best.params.items()})
    for path in [*save_plots(study, out_dir), overlay, out_dir / "trials.csv", out_dir / "summary.json"]:
        mlflow.log_artifact(str(path), "tune")
    return overlay


def write_trial_config(config: Config, study, trial: int, complete: list, out_dir: Path) -> Path:
    """Write complete trial ``trial``'s config, ``trial-<n>.yaml``, naming the ``complete`` ones if it is not one."""
    import optuna

    if not 0 <= trial < len(study.trials) or study.trials[trial].state != optuna.trial.TrialState.COMPLETE:
        numbers = ", ".join(str(t.number) for t in complete)
        raise InputError(
            f"--trial {trial}: not a complete trial of study {config.tune.study_name!r} (complete: {numbers})"
        )
    return atomic_write_text(
        out_dir / f"trial-{trial}.yaml",
        best_overlay(
            config,
            study.trials[trial].params,
            f"trial {trial}'s parameters (validation accuracy {study.trials[trial].value:.4f})",
        ),
    )


def next_step(config: Config, best_params: dict[str, Any]) -> str:
    """What to run next: ``make compare-tuned``, unless the best parameters are the configured settings."""
    if not configured_differs(config, best_params):
        return (
            "the configured settings are the best found, so make compare-tuned has nothing to compare; "
            "make tune TRIAL=<n> writes another complete trial's config for SET='compare.tuned=...'"
        )
    return "next: make compare-tuned"


def run(config: Config, trials: int | None = None, trial: int | None = None) -> Path:
    """Run (or continue) the study; returns ``reports/tune/best.yaml``. ``trial``: also write that complete
    trial's configuration, ``reports/tune/trial-<n>.yaml`` (for ``compare.tuned``), and return it instead."""
    import optuna

    started = time.perf_counter()
    parameters = load_space(config)  # every bad input is refused here, before any trial
    require_output(config, "tokenize")
    storage_url = default_storage(config)
    storage = open_storage(storage_url, config.tune.heartbeat_seconds)
    settings = config.tune
    total = trials if trials is not None else settings.trials
    if total is None and settings.max_minutes is None:
        raise ConfigError("tune needs a budget: tune.trials and/or tune.max_minutes")
    study = open_study(config, storage, parameters)
    setup_tracking(config.tracking)
    out_dir = config.reports_dir / REPORT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    existing = parent_run_id(config.tracking, settings.study_name)
    with mlflow.start_run(run_id=existing, run_name=None if existing else f"tune-{settings.study_name}") as parent:
        mlflow.set_tags({STUDY_TAG: settings.study_name, "optuna_storage": storage_url})
        if not existing:
            mlflow.log_params({k: v for k, v in flat_params(config).items() if not k.startswith("paths.")})
        optimize(study, config, parameters, total)
        states = {state.name.lower(): sum(t.state == state for t in study.trials) for state in optuna.trial.TrialState}
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            raise InputError(
                f"study {settings.study_name!r} has no complete trial yet ({states}); run `make tune` again"
            )
        best = study.best_trial
        overlay = write_study_reports(config, study, best, states, out_dir, storage_url, parent.info.run_id)
    # after the study's reports, so a wrong number loses none of them
    chosen = None if trial is None else write_trial_config(config, study, trial, complete, out_dir)
    written = f"{overlay}" + (f" and {chosen}" if chosen else "")
    mine = sum(t.user_attrs.get("process") == os.getpid() for t in study.trials)
    print(
        f"tune: study {settings.study_name!r} in {storage_url}: {mine} trial(s) by this process, "
        f"{len(study.trials)} in all ({', '.join(f'{k} {v}' for k, v in states.items() if v)}); best validation "
        f"accuracy {best.value:.4f} (trial {best.number}); wrote {written} ({next_step(config, best.params)}) in "
        f"{time.perf_counter() - started:.0f}s"
    )
    return chosen or overlay


def main(config: Config, args) -> None:
    run(config, trials=args.trials, trial=args.trial)
