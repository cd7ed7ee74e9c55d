"""A comparison's report: the verdict in words, the Markdown and JSON files, the plot, the MLflow descriptions.

Pure functions of the comparison's payload (the dict ``reports/<design report>.json`` holds), apart from
:func:`write_reports`, which writes ``reports/<name>.{json,md,png}`` and returns their paths.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.files import atomic_write_json, atomic_write_text
from pipeline.model.kinds import kind_of
from pipeline.stages.compare.candidates import LABELS, NBSVM, SELECTION, SUMMARY_METRICS
from pipeline.stages.evaluate import behaviour


def effect_sentence(effect: dict, n_test: int) -> str:
    difference, boot = effect["mean_accuracy_difference"], effect["bootstrap"]
    a, b, factor = effect["a"], effect["b"], effect["factor"]
    p_values = ", ".join(f"{s['p_value']:.3g}" for s in effect["mcnemar"])
    better, worse = (a, b) if difference > 0 else (b, a)
    subject = f"{factor} ({effect['scope']})" if effect["scope"] != "candidates" else "candidates"
    evidence = (
        f"{subject}: {a} minus {b} test accuracy is {difference * 100:+.2f} points over "
        f"{len(effect['mcnemar'])} matched pairs on {n_test:,} test reviews (paired bootstrap 95% CI "
        f"{boot['ci_low'] * 100:+.2f} to {boot['ci_high'] * 100:+.2f}; McNemar p per pair: {p_values})."
    )
    if effect["significant"]:
        return evidence + (
            f" Significant: {better} beats {worse} on this test set under this budget "
            "(the CI covers test-set sampling for these seeds, not other datasets, sizes or budgets)."
        )
    return evidence + (
        " Not significant by the criterion: these runs do not show that either is better at this "
        "budget; they do not show the two are equivalent either."
    )


def deploy_sentence(best: dict) -> str:
    kind = kind_of(best["kind"]).deploys_as
    if "val_crop_accuracy" in best:
        sentence = (
            f"Deploy `{best['variant']}`, {kind}: of the candidates within {best['tolerance'] * 100:.2g} "
            f"points of the best mean validation accuracy, it has the best mean accuracy on the validation "
            f"sentence crops ({best['val_crop_accuracy']:.4f}; validation {best[SELECTION]:.4f}), "
            f"which is what `make register` uses; its mean test accuracy is {best['test_accuracy']:.4f}, "
            f"{best['test_crop_accuracy']:.4f} on the test crops."
        )
    else:  # candidates evaluated before the crops existed
        sentence = (
            f"Deploy `{best['variant']}`, {kind}: it has the highest mean validation accuracy "
            f"({best[SELECTION]:.4f}) of every candidate, which is what `make register` uses; its "
            f"mean test accuracy is {best['test_accuracy']:.4f}."
        )
    if "baseline_test_accuracy" in best and best["variant"] != NBSVM:
        gap = (best["test_accuracy"] - best["baseline_test_accuracy"]) * 100
        sentence += (
            f" That is {abs(gap):.2f} points {'above' if gap > 0 else 'below'} the NBSVM baseline "
            f"({best['baseline_test_accuracy']:.4f}) on test."
        )
    if "best_transformer" in best and best["best_transformer"] != best["variant"]:
        sentence += (
            f" The best Transformer alone (`{best['best_transformer']}`) reaches "
            f"{best['best_transformer_test_accuracy']:.4f}."
        )
    return sentence


def verdict(payload: dict) -> str:
    sentences = [effect_sentence(effect, payload["test_rows"]) for effect in payload["effects"].values()]
    for effect in payload.get("fusion_effects", {}).values():
        sentences.append(effect_sentence(effect, payload["test_rows"]))
    if payload.get("interaction"):
        inter = payload["interaction"]
        boot = inter["bootstrap"]
        sentences.append(
            f"Interaction, {inter['description']}: {inter['difference'] * 100:+.2f} points (95% CI "
            f"{boot['ci_low'] * 100:+.2f} to {boot['ci_high'] * 100:+.2f}), "
            + ("significant." if inter["significant"] else "not significant.")
        )
    for effect in payload.get("versus", []):
        sentences.append(effect_sentence(effect, payload["test_rows"]))
    return " ".join(sentences + [deploy_sentence(payload["recommendation"])])


def plot_comparison(payload: dict, path: Path) -> Path:
    from pipeline.core.plots import new_figure, save_figure

    summary, names = payload["summary"], payload["candidates"]
    lengths = {name: row for name, row in (payload.get("lengths") or {}).items() if "test crops" in row}
    figure, axes = new_figure(width=19.5 if lengths else 13, height=5, ncols=3 if lengths else 2)
    accuracy_axis, effect_axis = axes[0], axes[1]
    for x, name in enumerate(names):
        entry = summary[name]
        values = entry["test_accuracy"]["values"]
        accuracy_axis.scatter([x] * len(values), values, color=kind_of(entry["kind"]).colour, zorder=3)
        accuracy_axis.errorbar(
            x + 0.12,
            entry["test_accuracy"]["mean"],
            yerr=entry["test_accuracy"]["std"],
            fmt="s",
            color="black",
            capsize=4,
            label="mean ± std" if x == 0 else None,
        )
    accuracy_axis.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    accuracy_axis.set(ylabel="test accuracy", title="Test accuracy by candidate (dots: seeds)")
    accuracy_axis.legend(fontsize=8)

    effects = (
        list(payload["effects"].values()) + list(payload.get("fusion_effects", {}).values()) + payload.get("versus", [])
    )
    rows = [
        (
            f"{e['factor']}: {e['a']} - {e['b']}" + (f" ({e['scope']})" if e["scope"] != "candidates" else ""),
            e["bootstrap"],
        )
        for e in effects
    ]
    if payload.get("interaction"):
        rows.append(("interaction", payload["interaction"]["bootstrap"]))
    for y, (_label, boot) in enumerate(rows):
        effect_axis.errorbar(
            100 * boot["difference"],
            y,
            xerr=[[100 * (boot["difference"] - boot["ci_low"])], [100 * (boot["ci_high"] - boot["difference"])]],
            fmt="o",
            capsize=5,
            color="tab:orange",
        )
    effect_axis.axvline(0, color="black", linewidth=0.8)
    effect_axis.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    effect_axis.set(xlabel="test accuracy difference (points), paired bootstrap 95% CI", title="Effects")
    if lengths:
        plot_short_texts(axes[2], lengths, summary)
    return save_figure(figure, path)


def plot_short_texts(axis, lengths: dict, summary: dict) -> None:
    """Per candidate, accuracy on the test crops (short texts, noisy labels) with its 95% Wilson interval."""
    for y, (name, row) in enumerate(lengths.items()):
        crops = row["test crops"]
        axis.errorbar(
            crops["accuracy"],
            y,
            xerr=[[max(0.0, crops["accuracy"] - crops["ci_low"])], [max(0.0, crops["ci_high"] - crops["accuracy"])]],
            fmt="o",
            capsize=4,
            color=kind_of(summary[name]["kind"]).colour,
        )
    axis.set_yticks(range(len(lengths)), list(lengths), fontsize=8)
    axis.set(
        xlabel="accuracy on one sentence crop per test review (95% Wilson interval)",
        title="Short texts (crops labelled with their review's label)",
    )


def candidate_label(name: str, kind: str) -> str:
    if name in LABELS:
        return LABELS[name]
    return f"`{name}`" + kind_of(kind).suffix


def behaviour_table(payload: dict) -> list[str]:
    """Mean behaviour pass rate per capability (rows) and candidate (columns), when the runs have them."""
    columns = [name for name in payload["candidates"] if name in payload["summary"]]
    capabilities = [
        c
        for c in behaviour.CAPABILITIES
        if any(behaviour.metric_name(c) in payload["summary"][name] for name in columns)
    ]
    if not capabilities:
        return []
    lines = [
        "",
        "## Behaviour tests (mean pass rate over seeds)",
        "",
        "CheckList-style tests on sentences the project writes (`pipeline/stages/evaluate/behaviour.py`; "
        "each run's failing sentences are in its `evaluation/behaviour.md`).",
        "",
        "| capability | " + " | ".join(f"`{name}`" for name in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    for capability in capabilities:
        cells = [payload["summary"][name].get(behaviour.metric_name(capability)) for name in columns]
        lines.append(f"| {capability} | " + " | ".join("–" if c is None else f"{c['mean']:.0%}" for c in cells) + " |")
    return lines


def length_lines(payload: dict) -> list[str]:
    """Accuracy per word bucket of the test reviews and on the sentence crops, per candidate."""
    table = payload.get("lengths") or {}
    columns = list(dict.fromkeys(column for row in table.values() for column in row))
    if not columns:
        return []
    rows_of = {column: next(row[column]["rows"] for row in table.values() if column in row) for column in columns}
    lines = [
        "",
        "## Accuracy by length and on short texts",
        "",
        "Test reviews by length in words, and one sentence crop of every validation and test review: a random run "
        f"of one or two consecutive sentences (seeds {payload.get('crop_seed')} for validation and "
        f"{payload.get('crop_seed', 0) + 1} for test, `pipeline/text/crops.py`), "
        "labelled with its review's label. Crop labels are noisy both ways (a positive review has negative "
        "sentences): the crops compare models on short texts, they do not measure a true accuracy. Mean over "
        "seeds, 95% Wilson interval in brackets.",
        "",
        "| candidate | "
        + " | ".join(
            f"{column}{' words' if 'crops' not in column else ''} (n={rows_of[column]:,})" for column in columns
        )
        + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    for name, row in table.items():
        cells = [
            "–"
            if column not in row
            else f"{row[column]['accuracy']:.4f} [{row[column]['ci_low']:.3f}, {row[column]['ci_high']:.3f}]"
            for column in columns
        ]
        lines.append(f"| {candidate_label(name, payload['summary'][name]['kind'])} | " + " | ".join(cells) + " |")
    return lines


def factors_text(payload: dict) -> str:
    """What the comparison varied: ``one Transformer configuration``, or the factors and their levels; a preset's
    comparison names its checkpoint (``payload["encoder"]``; older payloads have none)."""
    encoder = payload.get("encoder") or "Transformer"
    if not payload["factors"]:
        return f"one {encoder} configuration"
    varied = ", ".join(f"`{key}` ({a} vs {b})" for key, (a, b) in payload["factors"].items())
    return varied + ("" if encoder == "Transformer" else f" of {encoder}")


def parent_description(payload: dict) -> str:
    """The comparison parent run's description in the MLflow UI: what was compared, the verdict, the table."""
    return "\n".join(
        [
            f"**Comparison of {factors_text(payload)}** over seeds {payload['seeds']} on "
            f"{payload['test_rows']:,} test reviews; child runs below: every Transformer variant and seed, "
            "the NBSVM baseline, the fused candidates and the TF-IDF reference. Full report: artifact "
            "`comparison/`.",
            "",
            f"**Verdict.** {payload['verdict']}",
            "",
        ]
        + summary_lines(payload)
    )


def summary_lines(payload: dict) -> list[str]:
    """The table of candidates: mean ± std over seeds of every summary metric."""
    lines = [
        "| candidate | kind | runs | test accuracy | test F1 | test ROC AUC | test log loss | test ECE | "
        "val accuracy (chosen by) | train seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in payload["candidates"]:
        entry = payload["summary"].get(name)
        if entry is None:
            continue
        cells = []
        for key in SUMMARY_METRICS:
            stat = entry.get(key)
            cells.append(
                "–"
                if stat is None
                else (
                    f"{stat['mean']:.4f} ± {stat['std']:.4f}"
                    if key != "train_seconds"
                    else f"{stat['mean']:.0f} ± {stat['std']:.0f}"
                )
            )
        lines.append(
            f"| {candidate_label(name, entry['kind'])} | {entry['kind']} | {len(entry['run_ids'])} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def effect_lines(effect: dict) -> list[str]:
    boot = effect["bootstrap"]
    title = f"### {effect['factor']}: {effect['a']} - {effect['b']}" + (
        f" ({effect['scope']})" if effect["scope"] != "candidates" else ""
    )
    lines = [
        title,
        "",
        f"- mean accuracy difference: {effect['mean_accuracy_difference'] * 100:+.2f} points",
        f"- paired bootstrap 95% CI ({boot['samples']} resamples of test reviews): "
        f"[{boot['ci_low'] * 100:+.2f}, {boot['ci_high'] * 100:+.2f}] points",
    ]
    for s in effect["mcnemar"]:
        where = f" ({s['at']})" if "at" in s else ""
        lines.append(
            f"- seed {s['seed']}{where}: difference {s['accuracy_difference'] * 100:+.2f} points; McNemar exact "
            f"p = {s['p_value']:.3g} (only {effect['a']} right: {s['only_a_correct']}, only {effect['b']} "
            f"right: {s['only_b_correct']})"
        )
    return lines + [f"- criterion: {effect['criterion']}", ""]


def markdown_report(payload: dict) -> str:
    lines = [
        f"# Comparison: {factors_text(payload)}",
        "",
        f"MLflow parent run `{payload['parent_run_id']}`; seeds {payload['seeds']}; "
        f"{payload['test_rows']:,} test reviews, {payload['val_rows']:,} validation reviews "
        f"({payload['split_rule']}); identical data, tokenizer, hyper-parameters and budget apart from the "
        "factors. Candidates are chosen on validation; test is read only for this report.",
        "",
    ]
    for level, settings in payload.get("levels", {}).items():
        lines += [
            f"`{level}` sets "
            + ", ".join(
                f"`{key}` = {value:.4g}" if isinstance(value, float) else f"`{key}` = {value}"
                for key, value in settings.items()
            )
            + "; the other level is the configuration as given.",
            "",
        ]
    lines += summary_lines(payload)
    lines += length_lines(payload)
    lines += behaviour_table(payload)
    lines += ["", "## Effects", ""]
    for effect in list(payload["effects"].values()) + list(payload.get("fusion_effects", {}).values()):
        lines += effect_lines(effect)
    if payload.get("interaction"):
        inter = payload["interaction"]
        lines += [
            "### Interaction",
            "",
            f"- {inter['description']}: {inter['difference'] * 100:+.2f} points, paired "
            f"bootstrap 95% CI [{inter['bootstrap']['ci_low'] * 100:+.2f}, {inter['bootstrap']['ci_high'] * 100:+.2f}]",
            "",
        ]
    if payload.get("versus"):
        lines += ["## Candidates against each other", ""]
        for effect in payload["versus"]:
            lines += effect_lines(effect)
    if payload.get("fusion_weights"):
        lines += [
            "## Fusion weights (chosen on validation)",
            "",
            "| fused candidate | seed | weight on the Transformer |",
            "| --- | --- | --- |",
        ]
        lines += [f"| `{row['variant']}` | {row['seed']} | {row['weight']:g} |" for row in payload["fusion_weights"]]
        lines.append("")
    lines += ["## Verdict", "", payload["verdict"], ""]
    return "\n".join(lines)


def write_reports(payload: dict, reports_dir: Path, name: str) -> list[Path]:
    """``<name>.json``, ``<name>.md`` and ``<name>.png`` under ``reports_dir`` (each written whole, then renamed)."""
    return [
        atomic_write_json(reports_dir / f"{name}.json", payload),
        atomic_write_text(reports_dir / f"{name}.md", markdown_report(payload)),
        plot_comparison(payload, reports_dir / f"{name}.png"),
    ]
