"""The most confident errors as a page a person reads: every word coloured by how it moved the model's score.

``confident_errors.html`` (written by ``make evaluate`` and by every candidate of ``make compare``, logged to the run
under ``evaluation/``): for each of the :data:`EXPLAINED_ERRORS` test reviews the model got wrong with the highest
confidence, its label, the prediction and the probability, the items that moved its log-odds most (as ``make score
EXPLAIN=1`` writes them) and the words in order on a green (towards ``positive``, or the predicted class for more than
two classes) to red background, its strength relative to the row's largest contribution. A fused model shows its
two parts' words, each with its fusion weight; a Transformer shows the words it read (its own row: the first
``max_sequence_length`` tokens, or head and tail), NBSVM every word with its share of each n-gram's contribution.
Pure HTML, no script: it opens from the MLflow UI's artifact view or from disk.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from pipeline.core.errors import InputError
from pipeline.core.files import atomic_write_text
from pipeline.model.explain import Explanation, explanation_text

EXPLAINED_ERRORS = 12
ERRORS_PAGE = "confident_errors.html"


def highlighted(words: tuple[tuple[str, float], ...]) -> str:
    """The words as HTML spans, each on a background whose colour is its sign and whose strength its share of the
    row's largest absolute contribution; the value is the span's tooltip."""
    largest = max((abs(value) for _, value in words), default=0.0) or 1.0
    spans = []
    for word, value in words:
        alpha = min(1.0, abs(value) / largest)
        colour = f"rgba(0, 150, 0, {alpha:.2f})" if value > 0 else f"rgba(210, 0, 0, {alpha:.2f})"
        spans.append(f'<span style="background:{colour}" title="{value:+.3f}">{html.escape(word)}</span>')
    return " ".join(spans)


def errors_page(title: str, errors: pd.DataFrame, texts: list[str], parts: list[tuple[str, list[Explanation]]]) -> str:
    """The page for ``errors`` (rows of ``errors.csv``) and their full ``texts``, explained by ``parts``."""
    rows = []
    for index, (_, error) in enumerate(errors.iterrows()):
        blocks = []
        for name, explanations in parts:
            explanation = explanations[index]
            blocks.append(
                f"<p><b>{html.escape(name)}</b> ({len(explanation.words)} tokens read): log-odds "
                f"{explanation.log_odds:+.2f}; "
                f"most: <code>{html.escape(explanation_text(explanation.items))}</code></p>"
                f'<p class="words">{highlighted(explanation.words)}</p>'
            )
        rows.append(
            f"<section><h2>{index + 1}. labelled {html.escape(str(error['label_name']))}, predicted "
            f"{html.escape(str(error['predicted_label']))} with confidence {error['confidence']:.3f}</h2>"
            f'<p class="source">{html.escape(str(error["source_file"]))}, {len(texts[index].split())} words'
            f"</p>{''.join(blocks)}</section>"
        )
    body = "".join(rows) or "<p>No errors on the test split.</p>"
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f"<title>Most confident errors: {html.escape(title)}</title><style>"
        "body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.7}"
        "h2{font-size:1.05em;margin-top:2em}.source{color:#666;font-size:.9em}.words span{padding:0 1px}"
        "</style></head><body>"
        f"<h1>Most confident errors: {html.escape(title)}</h1><p>Each word's background: green pushed the score "
        "towards <i>positive</i> (for more than two classes: towards the predicted class), red away from it; the "
        "stronger, the more (relative to the review's largest; the value on hover). Transformer: integrated "
        "gradients from the all-[PAD] review; NBSVM: its exact n-gram weights, shared among each n-gram's words."
        f"</p>{body}</body></html>"
    )


def write_errors_page(
    classifier, title: str, test: pd.DataFrame, errors: pd.DataFrame, path: Path, limit: int = EXPLAINED_ERRORS
) -> Path:
    """Explain the first ``limit`` rows of ``errors`` (``most_confident_errors``; its index that of ``test``) and
    write the page to ``path``."""
    shown = errors.head(limit)
    texts = test.loc[shown.index, "text"].tolist()
    try:
        parts = classifier.part_explanations(texts) if texts else []
    except InputError as error:  # a model without explanations (the TF-IDF reference row): the page says why
        parts, title = [], f"{title} (no word explanations: {error})"
    atomic_write_text(path, errors_page(title, shown, texts, parts))
    return path
