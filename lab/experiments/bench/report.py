"""The benchmark's Markdown report (``reports/bench.md``) from its results (``reports/bench.json``).

Pure functions: each takes the results (or one section of them) and returns rows or Markdown lines; nothing here
reads or writes a file.
"""

from __future__ import annotations


def utilisation_rows(results: dict) -> list[dict]:
    """One row per training workload with its fraction of the same-run, same-precision square-GEMM peak."""
    rows = []
    for workload in ("classifier_step", "masked_lm_step"):
        for encoder, variants in results.get(workload, {}).items():
            for variant, rates in variants.items():
                precision = "bfloat16" if "bfloat16" in variant else "float32"
                peak = results["peak"][precision]["square_2048"]
                rows.append(
                    {
                        "workload": workload.replace("_", " "),
                        "encoder": encoder,
                        "variant": variant,
                        "ms_per_step": rates["ms_per_step"],
                        "tokens_per_second": rates["tokens_per_second"],
                        "gflops": rates["gflops"],
                        "fraction_of_peak": rates["gflops"] / peak,
                        "fraction_of_float32_peak": rates["gflops"] / results["peak"]["float32"]["square_2048"],
                    }
                )
    return rows


def utilisation_lines(results: dict) -> list[str]:
    """The title, the same-run peaks, the training workloads against them and the GEMM table."""
    peak = results["peak"]
    lines = [
        "# Benchmark (one run; compare ratios, not absolute times)",
        "",
        f"Same-run GEMM peak (2048^3 square): float32 {peak['float32']['square_2048']:.0f} GFLOP/s, "
        f"bfloat16 {peak['bfloat16']['square_2048']:.0f} GFLOP/s.",
        "",
        "| workload | encoder | variant | ms/step | tokens/s | GFLOP/s | of same-precision peak | of float32 peak |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in utilisation_rows(results):
        lines.append(
            f"| {row['workload']} | {row['encoder']} | {row['variant']} | {row['ms_per_step']:.0f} | "
            f"{row['tokens_per_second']:,.0f} | {row['gflops']:.1f} | {row['fraction_of_peak']:.0%} | "
            f"{row['fraction_of_float32_peak']:.0%} |"
        )
    lines += ["", "| GEMM | float32 GFLOP/s | bfloat16 GFLOP/s |", "| --- | --- | --- |"]
    for name in peak["float32"]:
        lines.append(f"| {name} | {peak['float32'][name]:.0f} | {peak['bfloat16'][name]:.0f} |")
    return lines


def thread_lines(threads: dict) -> list[str]:
    """The classifier step's rates under each TensorFlow thread setting, as a table."""
    lines = [
        "",
        "| TF threads (classifier step, configured encoder, float32) | ms/step | tokens/s |",
        "| --- | --- | --- |",
    ]
    for name, rates in threads.items():
        lines.append(f"| {name} | {rates['ms_per_step']:.0f} | {rates['tokens_per_second']:,.0f} |")
    return lines


def padding_lines(padding: dict) -> list[str]:
    """The padding fraction of full-width and of length-bucketed batches, as a sentence."""
    return [
        "",
        f"Padding: {padding['full_width']:.1%} of computed positions at full width, "
        f"{padding['bucketed']:.1%} with length-bucketed batches.",
        "",
    ]


def scoring_lines(scoring: dict) -> list[str]:
    """The scoring rates as a table, then the tokenizer, the CSV path against the model alone and peak memory."""
    lines = ["| scoring | rows/s |", "| --- | --- |"]
    for key in (
        "tokenize_reference_rows_per_second",
        "tokenize_rows_per_second",
        "model_only_eager_rows_per_second",
        "model_only_rows_per_second",
        "score_csv_rows_per_second",
        "score_csv_streaming_rows_per_second",
    ):
        lines.append(f"| {key.replace('_rows_per_second', '').replace('_', ' ')} | {scoring[key]:,.0f} |")
    tokenizer_ratio = scoring["tokenize_rows_per_second"] / scoring["tokenize_reference_rows_per_second"]
    compiled_ratio = scoring["model_only_rows_per_second"] / scoring["model_only_eager_rows_per_second"]
    lines += [
        "",
        f"Tokenizer: {tokenizer_ratio:.2f}x "
        "KerasHub's on every whole text (`encode` with its exact shortcuts against `encode_reference`), "
        f"{scoring['tokenize_rows_differing_from_reference']:,} rows with other ids.",
        "",
        "In this process, with the model already loaded and compiled as for the model-alone rate, "
        f"CSV scoring runs at {scoring['score_csv_fraction_of_model_only']:.0%} of the model-alone rate "
        f"including its model load, {scoring['score_csv_streaming_fraction_of_model_only']:.0%} after it; "
        f"compiled model alone is {compiled_ratio:.1f}x the eager path. Peak memory of `score`: "
        + ", ".join(f"{m['peak_rss_mb']:,.0f} MiB for {m['rows']:,} rows" for m in scoring.get("fresh_process", [])),
        "",
    ]
    return (
        lines
        + fusion_lines(scoring.get("fusion"))
        + explain_lines(scoring.get("explain"))
        + fresh_process_lines(scoring.get("fresh_process", []))
    )


def explain_lines(explain: dict | None) -> list[str]:
    """``make score`` with and without ``EXPLAIN=1``, side by side."""
    if not explain:
        return []
    return [
        f"With explanations (`make score EXPLAIN=1`) the same {explain['rows']:,} rows score at "
        f"{explain['explained_rows_per_second']:,.1f} rows/s after the model load, "
        f"{explain['explained_fraction_of_plain']:.1%} of the {explain['plain_rows_per_second']:,.0f} rows/s "
        "without, measured side by side.",
        "",
    ]


def fusion_lines(fusion: dict | None) -> list[str]:
    """A fused model's CSV rate against its Transformer's alone, as a sentence (none without a fused model)."""
    if not fusion:
        return []
    return [
        f"The fused model scores a CSV at {fusion['fused_csv_rows_per_second']:,.0f} rows/s after its load, "
        f"{fusion['fused_fraction_of_transformer_csv']:.0%} of its Transformer alone "
        f"({fusion['transformer_csv_rows_per_second']:,.0f} rows/s), measured side by side.",
        "",
    ]


def fresh_process_lines(fresh: list[dict]) -> list[str]:
    """``score`` in a new process for each measured CSV, as a sentence (none when not measured)."""
    if not fresh:
        return []
    return [
        "`score` in a new process, as `make score` runs it (rows/s over the whole call: model load, "
        "compiling, reading, scoring and writing; start-up is the interpreter, imports and model load "
        "before the first row is read): "
        + "; ".join(
            f"{m['rows']:,} rows {m['rows_per_second']:,.0f} rows/s = {m['fraction_of_model_only']:.0%} "
            f"of the model-alone rate, start-up {m['startup_seconds']:.1f} s"
            for m in fresh
        ),
        "",
    ]


def ngram_lines(ngrams: dict) -> list[str]:
    """The model-alone scoring rate without and with hashed n-grams, as a table and their ratio."""
    lines = [
        f"| model alone, {ngrams['rows']:,} test rows, {ngrams['buckets']:,} n-gram buckets | rows/s | parameters |",
        "| --- | --- | --- |",
    ]
    for name, rates in ngrams["models"].items():
        lines.append(f"| {name} | {rates['rows_per_second']:,.0f} | {rates['parameters']:,} |")
    return lines + [
        "",
        f"With hashed n-grams the model alone scores at {ngrams['ngram_fraction_of_tokens_only']:.0%} "
        "of the tokens-only rate, measured side by side.",
        "",
    ]


def sparse_update_lines(sparse: dict) -> list[str]:
    """The training step under dense, lazy and no n-gram table updates, as a table and their ratios."""
    lines = [f"| training step, {sparse['buckets']:,} n-gram buckets | ms/step |", "| --- | --- |"]
    lines += [f"| {name} | {step['ms_per_step']:,.0f} |" for name, step in sparse["steps"].items()]
    return lines + [
        "",
        f"LazyAdamW's step takes {sparse['lazy_fraction_of_dense']:.2f}x the time of Keras' AdamW's; "
        f"with the table frozen (no update at all) {sparse['frozen_fraction_of_dense']:.2f}x.",
        "",
    ]


def export_lines(export: dict) -> list[str]:
    return [
        f"The exported graph ({export['model_kind']}, {export['saved_model_bytes'] / 1e6:.1f} MB on disk, written "
        f"in {export['write_seconds']:.0f} s) answers {export['graph_rows_per_second']:,.0f} rows/s in requests of "
        f"{export['graph_request_rows']:,} texts; `make score`'s pyfunc model "
        f"{export['pyfunc_rows_per_second']:,.0f} "
        f"rows/s in its chunks of {export['score_chunk_rows']:,} ({export['graph_fraction_of_pyfunc']:.2f}x), "
        f"{export['rows']:,} test reviews, side by side.",
        "",
    ]


INT8_VARIANTS = {
    "keras_int8": 'Keras int8 (`model.quantize("int8")`)',
    "onnx_float32": "ONNX Runtime float32",
    "onnx_int8": "ONNX Runtime dynamic int8",
}


def int8_lines(int8: dict) -> list[str]:
    variants = int8["variants"]
    floats = variants["float32"]
    lines = [
        f"Int8 against float32, the Transformer of {int8['model_uri']} alone, {int8['rows']:,} test reviews, side by "
        f"side; float32 on the compiled path: {floats['rows_per_second']:,.0f} rows/s, accuracy "
        f"{floats['accuracy']:.4f}.",
        "",
        "| variant | rows/s | against float32 | accuracy | McNemar p (float32 only / variant only) | labels changed "
        "| largest probability difference |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for name, label in INT8_VARIANTS.items():
        if name in variants:
            measured, test = variants[name], variants[name]["mcnemar"]
            lines.append(
                f"| {label} | {measured['rows_per_second']:,.0f} | {measured['speedup']:.2f}x | "
                f"{measured['accuracy']:.4f} | {test['p_value']:.3g} ({test['only_a_correct']} / "
                f"{test['only_b_correct']}) | {measured['labels_changed']:,} | "
                f"{measured['max_probability_difference']:.2e} |"
            )
    return [*lines, ""]


CASCADE_VARIANTS = {
    "cascade": "the cascade",
    "transformer": "its Transformer alone (float32)",
    "nbsvm": "its NBSVM alone",
}


def cascade_lines(cascade: dict) -> list[str]:
    every, test = cascade["every_text"], cascade["every_text"]["mcnemar"]
    lines = [
        f"A cascaded fusion, {cascade['model_uri']}: `make score` on {cascade['rows']:,} test reviews, side by side, "
        f"rows/s after the model load. Its Transformer read {every['transformer_share']:.1%} of them (NBSVM "
        f"confidence at most {cascade['threshold']:.4f}).",
        "",
        "| model | rows/s after the load | load (s) | accuracy |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, label in CASCADE_VARIANTS.items():
        measured = cascade["variants"][name]
        lines.append(
            f"| {label} | {measured['rows_per_second']:,.0f} | {measured['load_seconds']:.1f} | "
            f"{measured['accuracy']:.4f} |"
        )
    lines += [
        "",
        f"The cascade: {cascade['cascade_over_transformer']:.2f}x its Transformer's rate and "
        f"{cascade['cascade_fraction_of_nbsvm']:.1%} of NBSVM's. Against the fusion of every text "
        f"({every['accuracy']:.4f}, from the two parts' scored files): McNemar p = {test['p_value']:.3g} (every "
        "text only / cascade only: "
        f"{test['only_a_correct']} / {test['only_b_correct']}), {every['labels_changed']:,} labels changed, largest "
        f"probability difference on the rows the Transformer read {every['max_difference_where_read']:.2e}.",
        "",
    ]
    return lines


def markdown_report(results: dict) -> str:
    """The whole report as Markdown: utilisation, threads and padding, then each scoring section measured."""
    lines = utilisation_lines(results)
    if "threads" in results:
        lines += thread_lines(results["threads"])
    lines += padding_lines(results["padding"])
    if results.get("scoring"):
        lines += scoring_lines(results["scoring"])
    if results.get("ngram_scoring"):
        lines += ngram_lines(results["ngram_scoring"])
    if results.get("sparse_updates"):
        lines += sparse_update_lines(results["sparse_updates"])
    if results.get("export"):
        lines += export_lines(results["export"])
    if results.get("int8"):
        lines += int8_lines(results["int8"])
    if results.get("cascade"):
        lines += cascade_lines(results["cascade"])
    if results.get("serving"):
        lines += serving_lines(results["serving"], results.get("scoring"))
    return "\n".join(lines)


def serving_lines(serving: dict, scoring: dict | None) -> list[str]:
    """The served model under load (beside `make score`'s rate when measured), then its answers to bad requests."""
    beside = (
        f" `make score` in the same run: {scoring['score_csv_streaming_rows_per_second']:,.0f} rows/s after the load."
        if scoring and "score_csv_streaming_rows_per_second" in scoring
        else ""
    )
    lines = [
        f"`make serve` of {serving['model_uri']}, {serving['seconds_per_point']:g} s per point, each client a thread "
        f"with its own keep-alive connection.{beside}",
        "",
        "| workers | clients | rows per request | requests/s | rows/s | p50 ms | p99 ms | errors | peak GB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in serving["load"]:
        lines.append(
            f"| {row['workers']} | {row['clients']} | {row['batch']} | {row['requests_per_s']:,.1f} | "
            f"{row['rows_per_s']:,.0f} | {row['p50_ms']} | {row['p99_ms']} | {row['errors']} | {row['peak_gb']} |"
        )
    lines += [
        "",
        "| bad request | status | answer (first line) | seconds | next good request |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for row in serving["bad_requests"]:
        answer = row["answer"].replace("|", "\\|")
        lines.append(f"| {row['request']} | {row['status']} | `{answer}` | {row['seconds']} | {row['next']} |")
    return [*lines, ""]
