"""The champion's model card: data, splits, test metrics with bootstrap intervals, calibration, behaviour-test pass
rates, limits and intended use, read from the run's own parameters, metrics and evaluation artifacts."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import mlflow
import pandas as pd

from pipeline.core.catalog import METRICS_FILE, TEST_PREDICTIONS_FILE
from pipeline.core.errors import PipelineError
from pipeline.core.files import atomic_write_text
from pipeline.core.predictions import from_probability_columns
from pipeline.metrics import bootstrap_intervals
from pipeline.model.kinds import kind_of
from pipeline.stages.evaluate import behaviour
from pipeline.tracking import (
    VARIANT_TAG,
    VERSION_EXPORT_TAG,
    model_kind,
    selection_accuracy,
)

CARD_SAMPLES = 500  # bootstrap resamples of the test set for the card's intervals
WEAK_PASS_RATE = 0.8  # behaviour capabilities below this pass rate are named as limitations


def model_lines(run, client) -> tuple[str, list[str], dict]:
    """What the model is (its kind, lines for the card, from the kind itself) and the params of its Transformer, if it
    has one."""
    kind = model_kind(run.data.tags)
    lines, params = kind_of(kind).card_lines(run, client)
    return kind, lines, params


def metric_with_interval(test: dict, intervals: dict, key: str) -> str:
    """A test metric to four decimals, with its bootstrap 95% interval when there is one."""
    value = test[f"test_{key}"]
    ci = intervals.get(key)
    return f"{value:.4f}" + (f" (95% CI {ci['low']:.4f} to {ci['high']:.4f})" if ci else "")


def validation_rows(evaluation: dict, run) -> int | None:
    """The validation rows: from the evaluation, else from the run's logged validation dataset, else None."""
    return evaluation.get("val_rows") or next(
        (
            json.loads(d.dataset.profile).get("num_rows")
            for d in run.inputs.dataset_inputs
            if any(t.key == "mlflow.data.context" and t.value == "validation" for t in d.tags)
        ),
        None,
    )


def data_source(params: dict) -> str:
    """Where the reviews came from: a configured path, or the IMDB dataset and its download URL."""
    get = params.get
    return (
        str(get("data.path"))
        if get("data.source") not in (None, "imdb")
        else (f"IMDB Large Movie Review Dataset ({get('data.download_url') or 'aclImdb v1'})")
    )


def training_rows(params: dict, run) -> str:
    """The training rows for the Splits line: labelled ones, plus unlabeled distilled ones when there are any."""
    get = params.get
    train_rows = get("train_rows") or run.data.params.get("train_rows")
    distilled = int(get("pseudo_label_rows") or 0)
    if train_rows and distilled:  # distillation's rows are unlabeled reviews with the teacher's probabilities
        return (
            f"{int(train_rows) - distilled:,} labelled training reviews plus {distilled:,} unlabeled ones "
            f"with the {get('pseudo_label.teacher') or 'NBSVM'} teacher's probabilities (distillation), "
        )
    return f"{f'{int(train_rows):,}' if train_rows else '?'} training reviews, "


def behaviour_lines(rates: dict[str, float]) -> list[str]:
    """The behaviour-test pass rates as a table, or why there are none."""
    if not rates:
        return ["Not run (the labels are not negative/positive)."]
    return [
        "CheckList-style tests on sentences the project writes (failures: run artifact `evaluation/behaviour.md`).",
        "",
        "| capability | pass rate |",
        "| --- | --- |",
        *(f"| {capability} | {rate:.0%} |" for capability, rate in rates.items()),
    ]


def length_lines(evaluation: dict) -> list[str]:
    """Accuracy by length in words and on the sentence crops, and the shortest text the model was validated on;
    nothing for an evaluation from before the crops."""
    crops = evaluation.get("sentence_crops")
    if not crops:
        return []
    rows = [(f"{row['bucket']} words", row) for row in evaluation["accuracy_by_words"]]
    rows += [
        (f"sentence crops of the {name} reviews", crops[split])
        for split, name in (("val", "validation"), ("test", "test"))
    ]
    return [
        "",
        "## Accuracy by length",
        "",
        "Test reviews by length in words, and one random crop of one or two consecutive sentences of every "
        f"validation and test review (seeds {crops['seed']} and {crops['seed'] + 1}), "
        "labelled with its review's label: short texts with "
        "noisy labels (a positive review has negative sentences), a proxy for one-sentence reviews. The model "
        "was chosen on the validation reviews and their crops; the shortest text it was validated on has "
        f"**{evaluation['validated_min_words']} words** (1st percentile), and `make score` counts the rows "
        "shorter than that.",
        "",
        "| texts | rows | accuracy (95% Wilson interval) |",
        "| --- | --- | --- |",
        *(
            f"| {label} | {row['rows']:,} | {row['accuracy']:.4f} ({row['ci_low']:.4f} to {row['ci_high']:.4f}) |"
            for label, row in rows
        ),
    ]


def short_text_limit(evaluation: dict) -> str:
    """The limit on short texts, from the measurements when the evaluation has them."""
    crops = evaluation.get("sentence_crops")
    if not crops:
        return (
            "- English only; trained on IMDB movie reviews. Other languages, domains or very short texts are "
            "out of scope and untested."
        )
    return (
        f"- English only; trained on IMDB movie reviews. Other languages and domains are out of scope and "
        f"untested. Short texts are weaker: {crops['test']['accuracy']:.1%} on one- or two-sentence crops of test "
        f"reviews (noisy labels) against {evaluation['metrics']['test_accuracy']:.1%} on whole reviews; texts "
        f"under {evaluation['validated_min_words']} words are below what the model was validated on."
    )


def choice_sentence(metrics: dict, candidates: int, comparison_id: str) -> str:
    """How the version was chosen, by the rule its comparison used."""
    chosen_by = selection_accuracy(metrics) or float("nan")
    if "val_crop_accuracy" not in metrics:
        return (
            f"chosen as the candidate with the highest mean validation accuracy among {candidates} model runs "
            f"of comparison `{comparison_id}` (this run: {chosen_by:.4f})."
        )
    return (
        f"chosen among {candidates} model runs of comparison `{comparison_id}`: of the candidates within "
        "`compare.champion_tolerance` of the best mean validation accuracy, the best on the validation sentence "
        f"crops (this run: {chosen_by:.4f} on validation reviews, "
        f"{metrics['val_crop_accuracy']:.4f} on their crops)."
    )


def use_and_limit_lines(params: dict, kind: str, weak: list[str], evaluation: dict) -> list[str]:
    """Intended use and limits: how a long review is read (for a model with a Transformer), scope and short texts,
    and the ``weak`` behaviour capabilities."""
    get = params.get
    lines = [
        "",
        "## Intended use and limits",
        "",
        "- Intended use: scoring the overall sentiment of English reviews of films (and similar reviews) in "
        "bulk, with `make score`, `make serve` or Spark; the probability is calibrated as above.",
        *[
            note
            for note in [
                kind_of(kind).cut_note(
                    get("tokenizer.max_sequence_length"), windows=get("model.long_reviews") == "windows"
                )
            ]
            if note
        ],
        short_text_limit(evaluation),
        "- Not for decisions about people. Missing, blank or numeric texts get no score (a `score_error`).",
    ]
    if weak:
        lines.append(f"- Weak capabilities (pass rate under {WEAK_PASS_RATE:.0%}): {', '.join(weak)}.")
    return lines


def deployment_lines(version_tags: dict) -> list[str]:
    """How to deploy the version: its pinned environment, and its exported graph when ``make export`` wrote one."""
    exported = version_tags.get(VERSION_EXPORT_TAG)
    return [
        "",
        "## Deployment",
        "",
        "- MLflow model (`make score`, `make serve`, Spark): its `requirements.txt` pins every package's version.",
        f"- TensorFlow SavedModel, raw text in, the same answers (`make export`): `{exported}`; it needs "
        "TensorFlow and tensorflow-text only (TF Serving: docs/export.md)."
        if exported
        else "- No TensorFlow SavedModel exported yet: `make export` writes one (docs/export.md).",
    ]


def model_card(
    name: str,
    version: str,
    run,
    evaluation: dict,
    intervals: dict,
    candidates: int,
    comparison_id: str,
    version_tags: dict | None = None,
) -> str:
    """The model card (Markdown) of a registered version, from its run, that run's evaluation and the version's
    tags."""
    client = mlflow.tracking.MlflowClient()
    kind, description, transformer_params = model_lines(run, client)
    metrics = run.data.metrics
    test = evaluation["metrics"]
    n_test = evaluation["test_rows"]
    validation = validation_rows(evaluation, run)
    found = evaluation.get("behaviour") or {}
    rates = {c: found[c] for c in behaviour.CAPABILITIES if c in found}
    lines = [
        f"# Model card: {name} version {version}",
        "",
        f"Sentiment classifier for English movie reviews: labels {', '.join(evaluation['labels'])}. "
        f"MLflow run `{run.info.run_id}` ({run.data.tags.get(VARIANT_TAG, kind)}), "
        + choice_sentence(metrics, candidates, comparison_id),
        "",
        "## Model",
        "",
        *description,
        "",
        "## Data",
        "",
        f"- Source: {data_source(transformer_params)}.",
        f"- Splits: {training_rows(transformer_params, run)}"
        f"{f'{validation:,}' if validation is not None else '?'} "
        f"validation reviews (model selection and early stopping), {n_test:,} test reviews (only for the "
        "numbers below; never for choosing a model).",
        "",
        f"## Test metrics ({n_test:,} reviews; bootstrap 95% intervals, {CARD_SAMPLES} resamples)",
        "",
        *(
            f"- {label} {metric_with_interval(test, intervals, key)}"
            for label, key in (("accuracy", "accuracy"), ("F1", "f1"), ("ROC AUC", "roc_auc"))
        ),
        f"- log loss {test['test_log_loss']:.4f}",
        "",
        "## Calibration",
        "",
        f"- expected calibration error {test['test_ece']:.4f}"
        + (f", Brier score {test['test_brier']:.4f}" if "test_brier" in test else "")
        + "; reliability diagram: run artifact `evaluation/reliability.png`.",
        *length_lines(evaluation),
        "",
        "## Behaviour tests",
        "",
        *behaviour_lines(rates),
    ]
    weak = [c for c, rate in rates.items() if rate < WEAK_PASS_RATE]
    lines += use_and_limit_lines(transformer_params, kind, weak, evaluation) + deployment_lines(version_tags or {})
    return "\n".join(lines) + "\n"


def run_evaluation(run_id: str) -> tuple[dict, pd.DataFrame]:
    """The run's ``evaluation/metrics.json`` and test predictions, from its MLflow artifacts."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            files = {
                name: Path(
                    mlflow.artifacts.download_artifacts(
                        run_id=run_id, artifact_path=f"evaluation/{name}", dst_path=folder
                    )
                )
                for name in (METRICS_FILE, TEST_PREDICTIONS_FILE)
            }
        except (mlflow.exceptions.MlflowException, OSError):
            raise PipelineError(f"run {run_id} has no evaluation artifacts: run `make evaluate RUN={run_id}`") from None
        return json.loads(files[METRICS_FILE].read_text()), pd.read_parquet(files[TEST_PREDICTIONS_FILE])


def write_model_card(reports_dir: Path, name: str, version: str, run, candidates: int, comparison_id: str) -> Path:
    """Set the version's description to its model card and write ``reports/<run_id>/model_card.md``."""
    evaluation, predictions = run_evaluation(run.info.run_id)
    probabilities = from_probability_columns(predictions, evaluation["labels"])
    intervals = bootstrap_intervals(
        predictions["label"].to_numpy(), probabilities, evaluation["labels"], samples=CARD_SAMPLES
    )
    client = mlflow.tracking.MlflowClient()
    card = model_card(
        name,
        version,
        run,
        evaluation,
        intervals,
        candidates,
        comparison_id,
        client.get_model_version(name, version).tags,
    )
    client.update_model_version(name, version, description=card)
    return atomic_write_text(Path(reports_dir) / run.info.run_id / "model_card.md", card)
