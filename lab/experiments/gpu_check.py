"""The prepared GPU check: the product's comparison, on Keras' JAX backend, on a GPU machine without TensorFlow.

Two halves, one per machine:

- ``make gpu-check-bundle`` (here, with TensorFlow): the ingested splits (parquet, zstd), the tokenize stage's outputs
  but its id arrays, a token store of every text the stages will tokenize (``pipeline.text.token_store``), the config,
  and wheels for Python 3.12 of what the GPU machine lacks (Keras, KerasHub, MLflow and their needs, not the packages
  ``tools/gpu_check/device_packages.txt`` lists) -> ``gpu_check/`` (git-ignored; sized to travel, at most 64 MiB);
- ``tools/gpu_check/run.sh`` there (``make gpu-check``): installs the wheels, rebuilds the id arrays from the store
  (checked against the checksums recorded here), runs ``compare`` with ``KERAS_BACKEND=jax``, and writes
  ``summary.md`` (per Transformer: epoch seconds, ms per step, share of the card's bf16 peak; test accuracy of every
  candidate), ``comparison.{md,json,png}`` and ``mlflow.db`` to ``$OUT``.

The suite dry-runs both halves on the CPU with tiny data, TensorFlow's import blocked (``tests/experiments``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml
from packaging.requirements import Requirement

from pipeline.config import Config, load_config
from pipeline.core.catalog import UNLABELED, UNLABELED_TABLE, ids_file, require_output
from pipeline.core.errors import ConfigError, InputError, MissingInputError
from pipeline.core.files import atomic_write_json, atomic_write_text, sha256_file
from pipeline.model.flops import TRAINING_STEP_FACTOR, EncoderShape, classifier_forward_flops
from pipeline.stages import compare
from pipeline.stages.compare.candidates import SELECTION
from pipeline.stages.evaluate.behaviour import build_suite
from pipeline.text.conventions import clean_text
from pipeline.text.text_tokenizer import load_text_tokenizer
from pipeline.text.token_store import STORE_ENV, write_token_store
from pipeline.text.wordpiece import WordPieceTextTokenizer

SPLITS = ("train", "val", "test")
BUNDLE_FILE, STORE_FILE, CONFIG_FILE = "bundle.json", "tokens.npz", "config.yaml"
CARRY_LIMIT = 64 * 2**20  # what one device call carries, the work tree included
DEVICE_PACKAGES = Path(__file__).resolve().parents[2] / "tools" / "gpu_check" / "device_packages.txt"
# what runs the comparison there; their needs are followed, the device's own packages and TensorFlow's are not
WHEEL_ROOTS = ("keras", "keras-hub", "mlflow-skinny", "sqlalchemy", "alembic")
# not carried: TensorFlow's (the dry run blocks them) and the full mlflow (its server and UI; mlflow-skinny is the
# same package without them)
NEVER_CARRIED = {"tensorflow", "tensorflow-text", "tf-keras", "tensorflow-io-gcs-filesystem", "mlflow"}
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# dense bf16 matrix throughput (TFLOP/s) of the cards this check has a figure for: the vendors' datasheet values
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# --------------------------------------------------------------------------- here: the bundle


def texts_to_store(ingest_dir: Path) -> list[str]:
    """Every text the comparison tokenizes: the splits', their sentence crops (every evaluation scores them), the
    logged model's example, the attention plot's and the behaviour tests' (cleaned, as the tokenizer reads them)."""
    from pipeline.model.logged_model import EXAMPLE_TEXTS
    from pipeline.stages.evaluate.lengths import crop_frames
    from pipeline.stages.evaluate.scorecard import ATTENTION_EXAMPLES

    splits = {split: pd.read_parquet(ingest_dir / f"{split}.parquet") for split in SPLITS}
    texts = [text for frame in splits.values() for text in frame["text"]]
    texts += [text for frame in crop_frames(splits["val"], splits["test"]).values() for text in frame["text"]]
    texts += [*EXAMPLE_TEXTS, *ATTENTION_EXAMPLES]
    texts += [text for case in build_suite() for text in (case.text, case.original) if text]
    return [clean_text(text) for text in texts]


def carried_packages(device_packages: set[str]) -> dict[str, str]:
    """{name: this environment's version} of every package :data:`WHEEL_ROOTS` need on Python 3.12 / Linux that the
    device lacks (followed through their requirements, extras aside)."""
    environment = {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    todo, found = list(WHEEL_ROOTS), {}
    while todo:
        name = canonical(todo.pop())
        if name in found or name in device_packages or name in NEVER_CARRIED:
            continue
        distribution = metadata.distribution(name)
        found[name] = distribution.version
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(requirement.name)
    return found


def download_wheels(packages: dict[str, str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [part for platform in WHEEL_PLATFORMS for part in ("--platform", platform)]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(folder),
        *(f"{name}=={version}" for name, version in sorted(packages.items())),
    ]
    if subprocess.run(command).returncode != 0:
        raise MissingInputError(f"pip could not download the wheels for {folder}/ (PyPI needed): {' '.join(command)}")


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def unlabeled_readers(config: Config) -> tuple[list[str], list[str]]:
    """The settings under which the check's comparison reads the unlabeled reviews: (their texts, their token ids).
    The bundle carries the texts only when a setting reads them, and never the ids (50,000 x 512 int32: 98 MiB)."""
    texts, ids = [], []
    if config.nbsvm.unlabeled_crops_per_review:
        texts.append(f"nbsvm.unlabeled_crops_per_review={config.nbsvm.unlabeled_crops_per_review}")
    if config.training.pseudo_labels:
        ids.append("training.pseudo_labels=true")
    if config.model.init == "pretrained":
        ids.append("model.init=pretrained")
    return texts, ids


def check_carry(bundle: Path) -> int:
    """The bundle's size; over :data:`CARRY_LIMIT`, the bundle is removed and an error names its largest files."""
    total = folder_size(bundle)
    if total >= CARRY_LIMIT:
        largest = sorted((path for path in bundle.rglob("*") if path.is_file()), key=lambda p: -p.stat().st_size)[:5]
        listed = ", ".join(f"{path.relative_to(bundle)} {path.stat().st_size / 2**20:.1f} MiB" for path in largest)
        shutil.rmtree(bundle)
        raise ConfigError(
            f"the GPU check's bundle came to {total / 2**20:.1f} MiB, over the {CARRY_LIMIT / 2**20:g} MiB a device "
            f"call carries; removed {bundle}/. Largest: {listed}"
        )
    return total


def make_bundle(config: Config, bundle: Path, wheels: bool = True) -> dict:
    """Write the bundle (see the module docstring) to ``bundle``; returns its ``bundle.json``. It carries what the
    config reads, whatever else the data folder holds, and at most :data:`CARRY_LIMIT` bytes."""
    ingest_dir, tokenize_dir = require_output(config, "ingest"), require_output(config, "tokenize")
    text_tokenizer = load_text_tokenizer(tokenize_dir)
    if not isinstance(text_tokenizer, WordPieceTextTokenizer):  # a preset's tokenizer (its preset is never None)
        raise ConfigError(
            f"model.preset {text_tokenizer.preset!r}: the token store holds the pipeline's own WordPiece "
            "ids only; the GPU check runs the pipeline's own encoder"
        )
    texts_read, ids_read = unlabeled_readers(config)
    if ids_read:
        raise ConfigError(
            f"{', '.join(ids_read)}: reads the unlabeled reviews' token ids, which the GPU check's bundle does not "
            "carry (too large for one device call); set it off (configs/gpu_check.yaml does)"
        )
    # written beside the target and renamed when whole: a refused or failed bundle leaves an earlier one as it was
    final, bundle = bundle, bundle.with_name(f".{bundle.name}.partial")
    shutil.rmtree(bundle, ignore_errors=True)
    (bundle / "data" / "ingest").mkdir(parents=True)
    for path in ingest_dir.iterdir():
        if path.name == UNLABELED_TABLE and not texts_read:
            continue
        target = bundle / "data" / "ingest" / path.name
        if path.suffix == ".parquet":  # the same rows, 13 % smaller than zstd-19 in 1 MB pages (train, measured)
            pq.write_table(
                pq.read_table(path),
                target,
                compression="zstd",
                compression_level=22,
                data_page_size=2**30,
                row_group_size=2**30,
            )
        elif path.is_file():
            shutil.copy2(path, target)
    ids = {split: ids_file(split) for split in SPLITS}
    shutil.copytree(  # the splits' ids are rebuilt there from the token store; the unlabeled reviews' are not read
        tokenize_dir,
        bundle / "data" / "tokenize",
        ignore=lambda _, names: [n for n in names if n in ids.values() or n.startswith(f"{UNLABELED}_")],
    )
    stored = write_token_store(
        bundle / STORE_FILE,
        text_tokenizer.identity,
        texts_to_store(ingest_dir),
        text_tokenizer.untruncated_rows,
        text_tokenizer.vocabulary_size,
    )
    atomic_write_text(bundle / CONFIG_FILE, yaml.safe_dump(config.to_dict(), sort_keys=False))
    carried = {}
    if wheels:
        device = {
            canonical(line.strip())
            for line in DEVICE_PACKAGES.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        }
        carried = carried_packages(device)
        download_wheels(carried, bundle / "wheels")
    ids_sha256 = {split: sha256_file(tokenize_dir / name) for split, name in ids.items()}
    total = check_carry(bundle)
    payload = {"ids_sha256": ids_sha256, "stored_texts": stored, "wheels": carried, "bytes": total}
    atomic_write_json(bundle / BUNDLE_FILE, payload)
    shutil.rmtree(final, ignore_errors=True)
    bundle.rename(final)
    size = total / 2**20
    print(f"gpu-check-bundle: {stored:,} texts in the token store, {len(carried)} wheels; {final}/ is {size:.1f} MiB")
    return payload


# --------------------------------------------------------------------------- there: the check


def unpack(bundle: Path, data_dir: Path) -> None:
    """The bundle's stage folders under ``data_dir``, the id arrays rebuilt from the token store and checked."""
    recorded = json.loads((bundle / BUNDLE_FILE).read_text())["ids_sha256"]
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.copytree(bundle / "data", data_dir)
    text_tokenizer = load_text_tokenizer(data_dir / "tokenize")
    for split in SPLITS:
        path = data_dir / "tokenize" / ids_file(split)
        np.save(path, text_tokenizer.encode(pd.read_parquet(data_dir / "ingest" / f"{split}.parquet")["text"].tolist()))
        if sha256_file(path) != recorded[split]:
            raise InputError(
                f"{path}: rebuilt from {bundle / STORE_FILE}, its checksum differs from the bundle's "
                f"({bundle / BUNDLE_FILE}); rebuild the bundle with `make gpu-check-bundle`"
            )


def peak_tflops(device: str) -> float | None:
    return next((peak for name, peak in PEAK_TFLOPS.items() if name in device), None)


def transformer_rows(config: Config, comparison: dict) -> list[dict]:
    """Per Transformer run of the comparison: epochs, seconds per epoch, ms per step, TFLOP/s and share of peak."""
    from pipeline.tracking import child_runs, metric_history

    rows = []
    for run in child_runs(config.tracking, comparison["parent_run_id"]):
        params = run.data.params
        if "model.pooling" not in params or "train_rows" not in params:
            continue
        epochs = metric_history(run.info.run_id, "epoch_seconds")
        padding = run.data.metrics.get("padding_fraction", 0.0)
        train_rows, batch = int(params["train_rows"]), int(params["training.batch_size"])
        steps = -(-train_rows // batch)
        tokens = run.data.metrics.get("tokens_per_second", 0.0) * (epochs[-1] if epochs else 0.0)
        width = max(1, round(tokens / max(train_rows, 1) / max(1e-9, 1 - padding)))  # mean computed width, approx.
        shape = EncoderShape.from_config(config.model, int(params["vocabulary_size"]))
        flops = TRAINING_STEP_FACTOR * train_rows * classifier_forward_flops(shape, width, int(params["num_classes"]))
        steady = float(np.median(epochs[1:])) if len(epochs) > 1 else (epochs[0] if epochs else float("nan"))
        tflops = flops / steady / 1e12 if epochs else float("nan")
        peak = peak_tflops(params.get("device", ""))
        rows.append(
            {
                "run": run.info.run_name,
                "device": params.get("device"),
                "precision": params.get("precision_policy"),
                "epochs": len(epochs),
                "first_epoch_s": epochs[0] if epochs else None,
                "epoch_s": steady,
                "ms_per_step": 1000 * steady / steps,
                "tflops": tflops,
                "share_of_peak": tflops / peak if peak else None,
            }
        )
    return sorted(rows, key=lambda row: row["run"])


def summary_markdown(rows: list[dict], comparison: dict, seconds: float) -> str:
    lines = [
        "# GPU check",
        "",
        f"{seconds:.0f} s in all; Transformer epochs after the first (which compiles) "
        "timed with validation; TFLOP/s from the analytic count (pipeline/model/flops.py) at the mean computed "
        "width, so approximate.",
        "",
        "| run | device | precision | epochs | first epoch s | epoch s | ms/step | TFLOP/s | share of peak |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        share = "n/a" if row["share_of_peak"] is None else f"{row['share_of_peak']:.1%}"
        lines.append(
            f"| {row['run']} | {row['device']} | {row['precision']} | {row['epochs']} | "
            f"{row['first_epoch_s']:.1f} | {row['epoch_s']:.1f} | {row['ms_per_step']:.1f} | "
            f"{row['tflops']:.3g} | {share} |"
        )
    lines += [
        "",
        "| candidate | seeds | validation accuracy (mean) | test accuracy (mean) | per seed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in comparison["candidates"]:
        entry = comparison["summary"].get(name, {})
        val, test = entry.get(SELECTION, {}), entry.get("test_accuracy", {})
        values = " / ".join(f"{value:.4f}" for value in test.get("values", []))
        lines.append(
            f"| {name} | {len(test.get('values', []))} | {val.get('mean', float('nan')):.4f} | "
            f"{test.get('mean', float('nan')):.4f} | {values} |"
        )
    return "\n".join(lines) + "\n"


def run_check(bundle: Path, out: Path, work: Path, overrides: list[str]) -> Path:
    """Unpack ``bundle`` into ``work``, run the comparison there on this process's Keras backend, and write the
    summary and reports to ``out``."""
    started = time.perf_counter()
    if not (bundle / BUNDLE_FILE).is_file():
        raise MissingInputError(f"no GPU check bundle at {bundle}/ (make it with `make gpu-check-bundle`)")
    os.environ[STORE_ENV] = str((bundle / STORE_FILE).resolve())
    shutil.rmtree(work, ignore_errors=True)  # one comparison: its runs alone in a new MLflow store
    unpack(bundle, work / "data")
    config = load_config(
        bundle / CONFIG_FILE,
        [
            f"paths.data_dir={work / 'data'}",
            f"paths.reports_dir={work / 'reports'}",
            f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}",
            *overrides,
        ],
    )
    from pipeline.tracking import setup_tracking

    report = compare.run(config)
    setup_tracking(config.tracking)
    comparison = json.loads(report.with_suffix(".json").read_text())
    rows = transformer_rows(config, comparison)
    out.mkdir(parents=True, exist_ok=True)
    summary = atomic_write_text(out / "summary.md", summary_markdown(rows, comparison, time.perf_counter() - started))
    for suffix in (".md", ".json", ".png"):
        shutil.copy2(report.with_suffix(suffix), out / f"comparison{suffix}")
    shutil.copy2(work / "mlflow.db", out / "mlflow.db")
    print(summary.read_text())
    return summary


def main(config: Config, args) -> None:
    if args.make_bundle:
        make_bundle(config, Path(args.bundle), wheels=not args.no_wheels)
    else:
        run_check(Path(args.bundle), Path(args.out), Path(args.work), args.overrides)
