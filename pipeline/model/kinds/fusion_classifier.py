"""The fusion kind: a Transformer and NBSVM in one artifact, answering as :class:`~pipeline.core.predictions.FusionRule`
says (its weights chosen on validation, a length limit with its own weight, a cascade's threshold), the one rule the
comparison's evaluation, the pyfunc model, its explanations and its export graph follow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from pipeline.core.errors import InputError
from pipeline.core.predictions import FUSION_EPS, FusionRule
from pipeline.model.explain import Explanation, fused_explanation
from pipeline.model.kinds.base import ARTIFACT_FUSION, PipelineModel
from pipeline.model.kinds.nbsvm_classifier import LexicalClassifier, lexical_lines
from pipeline.model.kinds.transformer_classifier import SentimentClassifier, transformer_lines
from pipeline.text import graph_ops
from pipeline.text.conventions import clean_text
from pipeline.text.crops import word_counts
from pipeline.tracking import (
    FUSION_CASCADE_SHARE_PARAM,
    FUSION_CASCADE_SHARES_PARAM,
    FUSION_CASCADE_THRESHOLD_PARAM,
    FUSION_CASCADE_TOLERANCE_PARAM,
    FUSION_LEXICAL_RUN_PARAM,
    FUSION_SHORT_WEIGHT_PARAM,
    FUSION_SHORT_WORDS_PARAM,
    FUSION_TRANSFORMER_RUN_PARAM,
    FUSION_WEIGHT_PARAM,
    FUSION_WEIGHTS_TRIED_PARAM,
)


class FusedClassifier(PipelineModel):
    """A Transformer and a lexical model in one artifact, with ``fusion.json``: the Transformer's weight chosen on
    validation, and for a length-aware fusion ``short_transformer_weight`` and ``short_max_words`` (texts of at most
    that many words get that weight), for a cascade ``cascade_threshold``. How it answers is :attr:`rule`.

    ``prepare`` gives (ids of the Transformer's texts, n-gram counts of every text, every text's weight, the rows the
    Transformer reads or None for every row)."""

    kind: ClassVar[str] = "fusion"
    colour: ClassVar[str] = "tab:purple"
    deploys_as: ClassVar[str] = "NBSVM fused with a Transformer (one artifact)"
    suffix: ClassVar[str] = " (fused)"

    @staticmethod
    def artifacts(keras_model, tokenizer, lexical_model, fusion_file, model_settings=None) -> dict[str, str]:
        return {
            **SentimentClassifier.artifacts(keras_model, tokenizer, model_settings),
            **FusedClassifier.lexical_artifacts(lexical_model, tokenizer, fusion_file),
        }

    @staticmethod
    def lexical_artifacts(lexical_model, labels_dir, fusion_file) -> dict[str, str]:
        """The artifacts a fusion adds to its Transformer's: the lexical model, its labels and the weight."""
        return {**LexicalClassifier.artifacts(lexical_model, labels_dir), ARTIFACT_FUSION: str(fusion_file)}

    def _load(self, artifacts) -> None:
        self.transformer = SentimentClassifier()
        self.transformer._load(artifacts)
        self.lexical = LexicalClassifier()
        self.lexical._load(artifacts)
        settings = json.loads(Path(artifacts[ARTIFACT_FUSION]).read_text())
        self.weight = float(settings["transformer_weight"])
        self.short_max_words = int(settings.get("short_max_words", 0))  # 0: one weight for every text
        self.short_weight = float(settings.get("short_transformer_weight", self.weight))
        threshold = settings.get("cascade_threshold")  # None: the Transformer reads every text
        self.cascade_threshold = None if threshold is None else float(threshold)
        self.transformer_run_id = settings.get("transformer_run_id")  # where its Transformer was trained
        self.lexical_run_id = settings.get("lexical_run_id")  # and its lexical model
        self.labels = self.transformer.labels
        if self.lexical.labels != self.labels or settings.get("labels", self.labels) != self.labels:
            raise InputError(
                f"fused model: the Transformer's labels {self.labels} differ from the lexical model's "
                f"{self.lexical.labels}"
            )

    @staticmethod
    def settings(rule: FusionRule, labels: Sequence[str], runs: tuple[str, str], share: float | None = None) -> dict:
        """What ``fusion.json`` holds (``_load`` reads it back): the rule, the labels, the two runs fused (Transformer,
        NBSVM) and a cascade's share of validation reviews."""
        return {
            "transformer_weight": rule.weight,
            **(
                {"short_transformer_weight": rule.short_weight, "short_max_words": rule.short_max_words}
                if rule.short_max_words
                else {}
            ),
            **({"cascade_threshold": rule.cascade_threshold, "cascade_share": share} if share is not None else {}),
            "labels": list(labels),
            "transformer_run_id": runs[0],
            "lexical_run_id": runs[1],
        }

    @staticmethod
    def run_params(
        rule: FusionRule,
        weights_tried: int,
        runs: tuple[str, str],
        cascade: tuple[float, Sequence[float], float] | None = None,
    ) -> dict:
        """The params a fused run logs (``card_lines`` and the register read them): the rule, the weights tried, the
        runs fused, and a cascade's (share, shares tried, tolerance)."""
        params = {
            FUSION_WEIGHT_PARAM: rule.weight,
            FUSION_WEIGHTS_TRIED_PARAM: weights_tried,
            FUSION_TRANSFORMER_RUN_PARAM: runs[0],
            FUSION_LEXICAL_RUN_PARAM: runs[1],
        }
        if rule.short_max_words:
            params |= {FUSION_SHORT_WEIGHT_PARAM: rule.short_weight, FUSION_SHORT_WORDS_PARAM: rule.short_max_words}
        if cascade is not None:
            share, tried, tolerance = cascade
            params |= {
                FUSION_CASCADE_SHARE_PARAM: share,
                FUSION_CASCADE_THRESHOLD_PARAM: rule.cascade_threshold,
                FUSION_CASCADE_SHARES_PARAM: ",".join(f"{s:g}" for s in tried),
                FUSION_CASCADE_TOLERANCE_PARAM: tolerance,
            }
        return params

    @property
    def rule(self) -> FusionRule:
        """How it answers: its weights, length limit and cascade threshold (read at every call: tests and the
        comparison may set them on a loaded model)."""
        return FusionRule(self.weight, self.short_weight, self.short_max_words, self.cascade_threshold)

    def row_weights(self, texts: Sequence[str]) -> np.ndarray:
        """The Transformer's weight for each text: ``short_weight`` up to ``short_max_words`` words, else ``weight``."""
        words = word_counts([clean_text(text) for text in texts]) if self.short_max_words else None  # as parts read
        return self.rule.row_weights(len(texts), words)

    def prepare(self, texts: Sequence[str]):
        """(ids of the texts its Transformer reads or None, n-gram counts of every text or None, every text's weight,
        the rows its Transformer reads or None for every row, NBSVM's probabilities when a cascade routed on them), as
        :class:`FusionRule` decides."""
        rule = self.rule
        counts = self.lexical.prepare(texts) if rule.runs_lexical else None
        lexical = self.lexical.score(counts) if rule.cascade_threshold is not None else None  # scored once: routed on
        routed = rule.routed(lexical) if lexical is not None else None
        read = texts if routed is None else [texts[int(row)] for row in routed]
        ids = self.transformer.prepare(read) if rule.runs_transformer else None
        return (ids, counts, self.row_weights(texts), routed, lexical)

    def score(self, prepared) -> np.ndarray:
        ids, counts, weights, routed, lexical = prepared
        reads = ids is not None and (routed is None or len(routed) > 0)
        transformer = self.transformer.score(ids) if reads else None
        if lexical is None and counts is not None:
            lexical = self.lexical.score(counts)
        return self.rule.answer(transformer, lexical, weights, routed)

    def explain(self, prepared, steps: int | None = None) -> list[Explanation]:
        """Each part's explanation weighted as the parts' log-probabilities are; a cascade's texts its Transformer does
        not read get NBSVM's alone."""
        ids, counts, weights, routed, _ = prepared
        if counts is None:  # NBSVM not run: the Transformer alone, as the fused model scores
            return self.transformer.explain(ids, steps)
        lexical = self.lexical.explain(counts)
        if ids is None:
            return lexical
        rows = range(len(lexical)) if routed is None else routed
        read = self.transformer.explain(ids, steps) if len(rows) else []
        for row, transformer in zip(rows, read):
            lexical[row] = fused_explanation(transformer, lexical[row], float(weights[row]))
        return lexical

    def part_explanations(self, texts: list[str]) -> list[tuple[str, list[Explanation]]]:
        rule, parts = self.rule, []
        short = f" up to {self.short_max_words} words" if self.short_max_words else ""

        def named(part: str, first: float, second: float) -> str:
            return f"{part} (weight {first:.2f}" + (f"; {second:.2f}{short}" if short else "") + ")"

        if rule.runs_transformer:
            parts += [(named("Transformer", self.weight, self.short_weight), self.transformer.words(texts))]
        if min(self.weight, self.short_weight) < 1:
            parts += [(named("NBSVM", 1 - self.weight, 1 - self.short_weight), self.lexical.words(texts))]
        return parts

    @property
    def transformer_part(self) -> SentimentClassifier:
        return self.transformer

    def graph(self, num_classes: int):
        """Both parts in one graph, answering as :class:`FusionRule` does (a cascade runs both parts here: a graph
        has no cheaper branch)."""
        rule = self.rule
        tracked: list = []
        transformer = lexical = None
        if rule.runs_transformer:
            part, transformer = self.transformer.graph(num_classes)
            tracked += part
        if rule.runs_lexical:
            part, lexical = self.lexical.graph(num_classes)
            tracked += part

        def fused(texts):
            import tensorflow as tf

            first = transformer(texts) if transformer is not None else None
            last = lexical(texts) if lexical is not None else None
            answer = fuse_graph(
                first if first is not None else last,
                last if last is not None else first,
                row_weights_graph(rule, texts),
            )
            if rule.cascade_threshold is not None:
                answer = tf.where(
                    cascade_rows_graph(last, rule.cascade_threshold)[:, None], answer, tf.cast(last, tf.float32)
                )
            return answer

        return tracked, fused

    @classmethod
    def card_lines(cls, run, client) -> tuple[list[str], dict[str, str]]:
        params = run.data.params
        transformer = client.get_run(params[FUSION_TRANSFORMER_RUN_PARAM])
        lexical = client.get_run(params[FUSION_LEXICAL_RUN_PARAM])
        weight = float(params[FUSION_WEIGHT_PARAM])
        short = (
            f"; texts of at most {params[FUSION_SHORT_WORDS_PARAM]} words get their own, "
            f"**{float(params[FUSION_SHORT_WEIGHT_PARAM]):g}** (chosen on the short validation reviews and "
            "sentence crops)"
            if FUSION_SHORT_WEIGHT_PARAM in params
            else ""
        )
        cascade = (
            f" A cascade: the Transformer reads only the texts NBSVM is least sure of (its confidence at most "
            f"{float(params[FUSION_CASCADE_THRESHOLD_PARAM]):.4f}, {float(params[FUSION_CASCADE_SHARE_PARAM]):.0%} of "
            f"the validation reviews); every other text gets NBSVM's probability.{cascade_choice(params)}"
            if FUSION_CASCADE_THRESHOLD_PARAM in params
            else ""
        )
        lines = [
            f"- A fused model in one artifact: the weighted average of two models' logits, **{weight:g} on the "
            f"Transformer** and {1 - weight:g} on NBSVM (the weight chosen on validation){short}.{cascade} Runs "
            f"`{transformer.info.run_id}` and `{lexical.info.run_id}`."
        ]
        lines += transformer_lines(transformer.data.params, transformer.data.tags, "Part one: ")
        lines += lexical_lines(lexical.data.params, "Part two: ")
        return lines, transformer.data.params

    @classmethod
    def cut_note(cls, max_tokens: str | None, windows: bool = False) -> str | None:
        if windows:
            return SentimentClassifier.cut_note(max_tokens, windows)
        return (
            f"- Reviews longer than {max_tokens} tokens are cut for the Transformer: text in the cut part does not "
            "count for that part of the model."
        )


def cascade_choice(params: dict[str, str]) -> str:
    """How a cascade's share was chosen, for its card (runs logged before the share was chosen: nothing)."""
    if FUSION_CASCADE_SHARES_PARAM not in params:
        return ""
    tolerance = float(params[FUSION_CASCADE_TOLERANCE_PARAM])
    return (
        f" The share is the smallest of {params[FUSION_CASCADE_SHARES_PARAM].replace(',', ', ')} whose validation "
        f"accuracy and validation crops' accuracy are within {tolerance:.1%} of the fusion of every text's; its "
        "validation figure is cross-fitted over that choice, with NBSVM's own answers cross-fitted over its C."
    )


def row_weights_graph(rule: FusionRule, texts):
    """``FusionRule.row_weights`` of cleaned ``texts``: ``float64[N, 1]``, the short weight for texts of at most
    ``short_max_words`` words (runs of non-space characters, as ``str.split`` counts them)."""
    import tensorflow as tf

    if not rule.short_max_words:
        return tf.fill([tf.shape(texts)[0], 1], tf.constant(rule.weight, tf.float64))
    space = graph_ops.whitespace_class()
    spaced = tf.strings.regex_replace(tf.strings.regex_replace(texts, f"{space}+", " "), "^ | $", "")
    words = tf.where(
        tf.equal(spaced, ""), tf.zeros_like(texts, tf.int64), tf.strings.split(spaced, sep=" ").row_lengths()
    )
    short = words <= rule.short_max_words
    return tf.expand_dims(
        tf.where(short, tf.constant(rule.short_weight, tf.float64), tf.constant(rule.weight, tf.float64)), 1
    )


def fuse_graph(transformer, lexical, weight):
    """``fuse_probabilities``: the weighted mean of the two log-probabilities, clipped, renormalised (float64);
    ``weight`` one number or ``[N, 1]``."""
    import tensorflow as tf

    transformer, lexical = tf.cast(transformer, tf.float64), tf.cast(lexical, tf.float64)
    if transformer.shape[-1] == 2:
        transformer = tf.stack([1.0 - transformer[:, 1], transformer[:, 1]], axis=1)
        lexical = tf.stack([1.0 - lexical[:, 1], lexical[:, 1]], axis=1)
    logits = weight * tf.math.log(tf.clip_by_value(transformer, FUSION_EPS, 1.0)) + (1.0 - weight) * tf.math.log(
        tf.clip_by_value(lexical, FUSION_EPS, 1.0)
    )
    return tf.cast(tf.nn.softmax(logits, axis=1), tf.float32)


def cascade_rows_graph(lexical, threshold: float):
    """``pipeline.core.predictions.cascade_rows``: the rows whose lexical confidence (float64, for two classes from the
    positive class's probability) is at most ``threshold``."""
    import tensorflow as tf

    positive = tf.cast(lexical, tf.float64)
    confidence = (
        tf.maximum(1.0 - positive[:, 1], positive[:, 1]) if lexical.shape[-1] == 2 else tf.reduce_max(positive, axis=1)
    )
    return confidence <= tf.constant(threshold, tf.float64)
