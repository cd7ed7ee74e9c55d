"""The benchmark report's arithmetic (timings themselves live in `make bench`, never in tests)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.experiments import bench
from pipeline.config import ModelConfig


def synthetic_results() -> dict:
    rates = {"seconds": 1.0, "tokens_per_second": 1000.0, "rows_per_second": 10.0, "gflops": 50.0, "ms_per_step": 100}
    return {
        "peak": {
            "float32": {"square_2048": 200.0, "m: tokens x 8 x 8": 20.0},
            "bfloat16": {"square_2048": 500.0, "m: tokens x 8 x 8": 25.0},
        },
        "classifier_step": {"m": {"float32": rates, "mixed_bfloat16": {**rates, "gflops": 100.0}}},
        "masked_lm_step": {"m": {"float32": {**rates, "gflops": 150.0}}},
        "padding": {"full_width": 0.4, "bucketed": 0.05},
    }


def test_utilisation_is_against_the_same_precision_peak():
    rows = {(r["workload"], r["variant"]): r for r in bench.utilisation_rows(synthetic_results())}
    assert rows[("classifier step", "float32")]["fraction_of_peak"] == 0.25
    assert rows[("classifier step", "mixed_bfloat16")]["fraction_of_peak"] == 0.2
    assert rows[("classifier step", "mixed_bfloat16")]["fraction_of_float32_peak"] == 0.5
    assert rows[("masked lm step", "float32")]["fraction_of_peak"] == 0.75


def test_markdown_report_shows_peaks_rows_and_padding():
    text = bench.markdown_report(synthetic_results())
    assert "float32 200 GFLOP/s, bfloat16 500 GFLOP/s" in text
    assert "| classifier step | m | float32 | 100 | 1,000 | 50.0 | 25% | 25% |" in text
    assert "40.0% of computed positions at full width, 5.0% with length-bucketed batches" in text


def test_markdown_report_gives_csv_scoring_with_and_without_the_model_load():
    scoring = {
        "tokenize_rows_per_second": 9000.0,
        "tokenize_reference_rows_per_second": 4000.0,
        "tokenize_rows_differing_from_reference": 0,
        "model_only_eager_rows_per_second": 1000.0,
        "model_only_rows_per_second": 2000.0,
        "score_csv_rows_per_second": 1500.0,
        "score_csv_fraction_of_model_only": 0.75,
        "score_csv_streaming_rows_per_second": 1800.0,
        "score_csv_streaming_fraction_of_model_only": 0.9,
        "explain": {
            "rows": 256,
            "plain_rows_per_second": 1700.0,
            "explained_rows_per_second": 17.0,
            "explained_fraction_of_plain": 0.01,
        },
        "fresh_process": [
            {
                "rows": 25000,
                "peak_rss_mb": 2000.0,
                "rows_per_second": 1200.0,
                "fraction_of_model_only": 0.6,
                "startup_seconds": 7.5,
                "load_seconds": 0.5,
            },
            {
                "rows": 250000,
                "peak_rss_mb": 2100.0,
                "rows_per_second": 1500.0,
                "fraction_of_model_only": 0.75,
                "startup_seconds": 7.0,
                "load_seconds": 0.5,
            },
        ],
    }
    text = bench.markdown_report({**synthetic_results(), "scoring": scoring})
    assert "| score csv streaming | 1,800 |" in text
    assert "75% of the model-alone rate including its model load, 90% after it" in text
    assert "2.0x the eager path" in text
    assert "Tokenizer: 2.25x KerasHub's on every whole text" in text and "0 rows with other ids" in text
    assert "25,000 rows 1,200 rows/s = 60% of the model-alone rate, start-up 7.5 s" in text
    assert "250,000 rows 1,500 rows/s = 75% of the model-alone rate, start-up 7.0 s" in text
    assert "2,000 MiB for 25,000 rows, 2,100 MiB for 250,000 rows" in text
    assert "the same 256 rows score at 17.0 rows/s after the model load, 1.0% of the 1,700 rows/s without" in text


def test_explanations_are_measured_beside_plain_scoring_on_the_same_rows(trained_run, tmp_path):
    import json

    import pandas as pd

    from lab.experiments.bench.scoring_speed import measure_explain_csv

    config, run_dir = trained_run
    uri = f"runs:/{json.loads((run_dir / 'manifest.json').read_text())['mlflow_run_id']}/model"
    measured = measure_explain_csv(
        config.tracking, uri, pd.Series(["A superb film.", "Dull.", "", "fine"] * 5), tmp_path
    )
    assert measured["rows"] == 20
    assert measured["plain_rows_per_second"] > 0 and measured["explained_rows_per_second"] > 0
    assert (
        measured["explained_fraction_of_plain"]
        == measured["explained_rows_per_second"] / measured["plain_rows_per_second"]
    )
    explained = pd.read_csv(tmp_path / "scored_explained.csv", keep_default_na=False)
    assert (explained["explanation"] != "").sum() == 15 and "explanation" not in pd.read_csv(
        tmp_path / "scored_plain.csv"
    ).columns


def test_sampled_batches_are_trimmed_real_rows():
    rng = np.random.default_rng(0)
    ids = np.zeros((100, 64), dtype=np.int32)
    for row, length in enumerate(rng.integers(2, 64, 100)):
        ids[row, :length] = rng.integers(4, 50, length)
    batches = bench.sample_batches(ids, batch_size=16, count=3)
    assert len(batches) == 3
    for batch in batches:
        longest = int((batch != 0).sum(axis=1).max())
        assert batch.shape[1] % 16 == 0 and longest <= batch.shape[1] < longest + 16  # trimmed to its bucket


def test_an_encoder_shaped_like_a_reference_is_measured_once():
    default_shape = bench.REFERENCE_ENCODERS["width 64 x 1 block"]
    assert "width 64 x 1 block" not in bench.measured_encoders(default_shape)
    other = ModelConfig(hidden_dim=128, num_layers=2, num_heads=4, intermediate_dim=256)
    assert set(bench.measured_encoders(other)) == {"configured", *bench.REFERENCE_ENCODERS}


def test_ngram_scoring_measures_both_models_on_the_same_rows_and_reports_the_ratio():
    ids = np.zeros((12, 16), dtype=np.int32)
    ids[:, 0] = 2
    ids[:, 1:9] = np.arange(5, 13)
    config = ModelConfig(hidden_dim=8, num_heads=2, intermediate_dim=16, ngram_buckets=64)
    measured = bench.measure_ngram_scoring(config, 20, 16, ids, passes=1)
    plain, with_ngrams = measured["models"].values()
    assert list(measured["models"]) == ["tokens", "tokens + 2..3-grams"]
    assert with_ngrams["parameters"] - plain["parameters"] == 64 * 8  # the table, and nothing else
    assert plain["rows_per_second"] > 0 and with_ngrams["rows_per_second"] > 0
    text = bench.markdown_report({**synthetic_results(), "ngram_scoring": measured})
    assert "| tokens + 2..3-grams |" in text and "64 n-gram buckets" in text


def test_sparse_updates_measures_three_optimizers_on_the_same_model_and_reports_the_ratios():
    ids = np.zeros((8, 16), dtype=np.int32)
    ids[:, 0] = 2
    ids[:, 1:9] = np.arange(5, 13)
    config = ModelConfig(hidden_dim=8, num_heads=2, intermediate_dim=16, ngram_buckets=64, ngram_max=1)
    measured = bench.measure_sparse_updates(config, 20, 16, bench.sample_batches(ids, batch_size=4, count=2), passes=1)
    dense, lazy, frozen = measured["steps"].values()
    assert measured["buckets"] == 64 and dense["parameters"] == lazy["parameters"] == frozen["parameters"]
    assert dense["parameters"] > 64 * 8  # a tokens-only config is measured with its n-gram table added
    assert min(dense["ms_per_step"], lazy["ms_per_step"], frozen["ms_per_step"]) > 0
    text = bench.markdown_report({**synthetic_results(), "sparse_updates": measured})
    assert "| LazyAdamW (training.sparse_updates) |" in text and "64 n-gram buckets" in text


def test_export_measures_the_graph_beside_make_scores_model_and_reports_both(comparison):
    import mlflow
    import pandas as pd

    from lab.experiments.bench.report import export_lines
    from lab.experiments.bench.scoring_speed import measure_export

    config, _ = comparison
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    run = next(
        r
        for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
        if r.data.tags.get("model_kind") == "transformer"
    )
    texts = pd.Series([f"a fine film number {i}, well acted" for i in range(40)])
    export = measure_export(f"runs:/{run.info.run_id}/model", texts, graph_rows=16, score_rows=32)
    assert export["rows"] == 40 and export["model_kind"] == "transformer" and export["saved_model_bytes"] > 10_000
    assert export["graph_rows_per_second"] > 0 and export["pyfunc_rows_per_second"] > 0
    assert export["graph_fraction_of_pyfunc"] == export["graph_rows_per_second"] / export["pyfunc_rows_per_second"]
    line = export_lines(export)[0]
    assert f"{export['graph_rows_per_second']:,.0f} rows/s in requests of 16" in line and "chunks of 32" in line


def test_int8_is_measured_beside_float32_on_the_same_rows_and_answers_close_to_it(trained_run):
    """Keras' int8 and ONNX Runtime's float32 and int8, each against the float32 model on the same rows."""
    import json

    from lab.experiments.bench.scoring_speed import measure_int8
    from pipeline.core.catalog import require_output
    from pipeline.stages.ingest.outputs import read_split

    config, run_dir = trained_run
    uri = f"runs:/{json.loads((run_dir / 'manifest.json').read_text())['mlflow_run_id']}/model"
    test = read_split(require_output(config, "ingest"), "test", columns=["text", "label"])
    measured = measure_int8(uri, test["text"], test["label"].to_numpy())
    variants = measured["variants"]
    assert measured["rows"] == len(test) and list(variants) == ["float32", "keras_int8", "onnx_float32", "onnx_int8"]
    assert variants["float32"]["accuracy"] > 0.9  # the tiny run separates its generated reviews
    # ONNX Runtime's float32 graph is the same function: a rounding apart, no label changes
    onnx_float32 = variants["onnx_float32"]
    assert onnx_float32["max_probability_difference"] < 1e-4 and onnx_float32["labels_changed"] == 0
    for name in ("keras_int8", "onnx_int8"):  # int8 weights move a probability a little, never most labels
        int8 = variants[name]
        assert 0 < int8["max_probability_difference"] < 0.2 and int8["labels_changed"] <= len(test) // 10, name
        changed = int8["mcnemar"]["only_a_correct"] + int8["mcnemar"]["only_b_correct"]
        # two classes: a label that changes turns a right answer wrong or a wrong one right, so McNemar's discordant
        # pairs are exactly the labels changed
        assert changed == int8["labels_changed"] and int8["rows_per_second"] > 0
    text = bench.markdown_report({**synthetic_results(), "int8": {"model_uri": uri, **measured}})
    assert f"Int8 against float32, the Transformer of {uri} alone" in text
    assert "| ONNX Runtime dynamic int8 |" in text and '| Keras int8 (`model.quantize("int8")`) |' in text


def test_a_cascade_is_measured_beside_its_transformer_and_its_nbsvm_and_answers_as_the_fusion_where_it_reads(
    comparison, tmp_path
):
    """A cascaded copy of a tiny fused run (weight 0.35: both parts count, the Transformer reads about half the
    texts): make score's rates side by side, and the cascade equal to the fusion of every text where it reads."""
    import json

    import mlflow

    from lab.experiments.bench.report import cascade_lines
    from lab.experiments.bench.scoring_speed import NoCascade, measure_cascade
    from pipeline.core.catalog import require_output
    from pipeline.core.predictions import lexical_confidence
    from pipeline.model.classifiers import load_classifier
    from pipeline.stages.ingest.outputs import read_split

    config, _ = comparison
    mlflow.set_tracking_uri(config.tracking.tracking_uri)
    fused = next(
        r
        for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
        if r.data.tags.get("model_kind") == "fusion"
    )
    fused_uri = f"runs:/{fused.info.run_id}/model"
    test = read_split(require_output(config, "ingest"), "test", columns=["text", "label"])
    with pytest.raises(NoCascade, match="not a cascaded fusion"):
        measure_cascade(config.tracking, fused_uri, test["text"], test["label"].to_numpy())
    folder = Path(mlflow.artifacts.download_artifacts(fused_uri, dst_path=str(tmp_path)))
    fusion_file = next(folder.rglob("fusion.json"))
    settings = json.loads(fusion_file.read_text())
    confidence = lexical_confidence(load_classifier(fused_uri).lexical.probabilities(test["text"].tolist()))
    settings.update(transformer_weight=0.35, short_transformer_weight=0.35)
    settings["cascade_threshold"] = float(np.median(confidence))
    fusion_file.write_text(json.dumps(settings))
    measured = measure_cascade(config.tracking, str(folder), test["text"], test["label"].to_numpy())
    every, rates = measured["every_text"], {k: v["rows_per_second"] for k, v in measured["variants"].items()}
    assert measured["rows"] == len(test) and list(rates) == ["cascade", "transformer", "nbsvm"]
    assert 0.3 < every["transformer_share"] < 0.7 and every["max_difference_where_read"] < 1e-4
    assert every["labels_changed"] <= round((1 - every["transformer_share"]) * len(test))  # only where NBSVM answers
    assert measured["cascade_over_transformer"] == rates["cascade"] / rates["transformer"]
    text = "\n".join(cascade_lines({"model_uri": str(folder), **measured}))
    assert f"Its Transformer read {every['transformer_share']:.1%} of them" in text
    assert "| its Transformer alone (float32) |" in text and "| its NBSVM alone |" in text


def test_the_benchs_rows_are_drawn_from_every_label_in_the_splits_order():
    """The splits are stored in label order: the first rows would be of one class."""
    from lab.experiments.bench import stratified_rows

    frame = pd.DataFrame({"text": [f"t{i}" for i in range(100)], "label": [0] * 70 + [1] * 30})
    kept = stratified_rows(frame, 20)
    assert len(kept) == 20 and kept["label"].value_counts().to_dict() == {0: 14, 1: 6}
    assert kept.index.is_monotonic_increasing and stratified_rows(frame, 200) is frame


def test_the_served_model_is_loaded_by_clients_and_answers_every_bad_request_then_the_next_good_one(trained_run):
    """`make bench --only serve` on a tiny model, briefly: a load row per (workers, clients, rows per request) with
    requests counted and no errors, each bad request's status and message, and the good request after each answered;
    the report's two tables."""
    import json

    from lab.experiments.bench.report import serving_lines
    from lab.experiments.bench.serve_load import BAD_REQUESTS, measure_serving

    config, run_dir = trained_run
    uri = f"runs:/{json.loads((run_dir / 'manifest.json').read_text())['mlflow_run_id']}/model"
    asked = (
        "malformed JSON",
        "no text field",
        "null text",
        "an empty list",
        "invalid UTF-8",
        "10,001 rows",
        "text/plain",
    )
    served = measure_serving(
        config.tracking,
        uri,
        ["A superb film.", "Dull."] * 50,
        workers=(1,),
        clients=(3,),
        seconds=1,
        requests={name: BAD_REQUESTS[name] for name in asked},
    )
    assert [(row["clients"], row["batch"]) for row in served["load"]] == [(3, 1), (3, 100)]
    for row in served["load"]:
        assert row["requests"] > 0 and row["errors"] == 0 and row["peak_gb"] > 0.05
        assert row["rows_per_s"] == pytest.approx(row["requests_per_s"] * row["batch"], abs=0.05 * row["batch"] + 0.1)
    statuses = {row["request"]: row["status"] for row in served["bad_requests"]}
    assert list(statuses) == list(asked)
    assert statuses["malformed JSON"] == statuses["no text field"] == statuses["an empty list"] == 400
    assert statuses["invalid UTF-8"] == 400 and statuses["text/plain"] == 415 and statuses["10,001 rows"] == 413
    assert statuses["null text"] == 200  # the row's reason in its score_error, as make score
    assert all(row["next"] == 200 for row in served["bad_requests"])
    no_text = next(row for row in served["bad_requests"] if row["request"] == "no text field")
    assert "text" in no_text["answer"] and "review" in no_text["answer"]
    report = "\n".join(serving_lines(served, None))
    assert "| 1 | 3 | 100 |" in report and "| no text field | 400 |" in report
