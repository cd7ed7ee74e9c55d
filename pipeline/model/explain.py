"""Why a text scored as it did: the signed contributions of its words and n-grams to the model's log-odds.

What is explained, for every model kind, is one number per text, the *log-odds* of a target class ``t``:
``log p_t - mean(log p_j for j != t)``. For two classes ``t`` is the second label (``positive``), and this is the
logit ``log(p / (1 - p))``: a ``+`` item pushed the text towards ``positive``. For more classes ``t`` is the
predicted class (NBSVM: its one-vs-rest logit).

- **NBSVM** (:func:`lexical_explanations`): exact. Its logit is the intercept plus one weight (naive-Bayes ratio
  times coefficient) per n-gram the text holds (``pipeline.lexical.nbsvm_weights``), so each n-gram's contribution
  is that weight and they sum to ``logit - intercept``.
- **Transformer** (:func:`integrated_gradients`; the pipeline's own encoder and a preset's backbone alike):
  integrated gradients (Sundararajan et al. 2017) over the token-embedding vectors (and the hashed n-gram vectors,
  which belong to the token they end at), from a reference where every text token is ``[PAD]`` (its vector, no
  n-gram vector), the special tokens and the padding mask kept: the all-``[PAD]`` review of the same length, whose
  special tokens then get no attribution. The
  path integral is a midpoint sum over ``steps`` points, so the contributions sum to ``logit - reference logit`` up to
  that sum's error (tests bound it). Word pieces (``##``) add up into their word; a word met twice adds up.
  Gradients come from the Keras backend in use (TensorFlow's tape, ``jax.grad``).
- **Fusion** (:func:`explain`): the fused log-odds is ``w`` times the Transformer's plus ``1 - w`` times NBSVM's
  (``pipeline.core.predictions.fuse_probabilities``; ``w`` the text's own in a length-aware fusion), so the items
  are the two parts' items weighted the same way. A cascade's texts that its Transformer does not read get NBSVM's.

:func:`explanation_text` writes the items that moved the log-odds most as ``+great, +loved, -boring``.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import ConfigError, InputError
from pipeline.model.forward import forward_pass
from pipeline.model.preset_classifier import preset_backbone_of
from pipeline.text.conventions import PAD_ID

EXPLANATION_COLUMN = "explanation"
TOP_ITEMS = 5  # items an explanation shows
IG_STEPS = 16  # points of the integrated-gradients path sum
IG_BATCH = 256  # interpolated sequences per forward and backward pass, at most
# and at most about this many activation floats kept for the backward pass (4 GB): 256 sequences of a 128-token
# all-MiniLM-L6-v2 took 19.6 GB, which killed `make compare` on a 24 GB machine; the own encoder stays at IG_BATCH
IG_MEMORY_FLOATS = 1_000_000_000
SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<pad>", "<mask>"})
PIECE_PREFIX = "##"  # WordPiece's mark of a piece continuing the previous word
_WORDLIKE = re.compile(r"[^\W_]|[!?]")  # an item the column shows: a letter or digit, or ! or ?
_NBSVM_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LexicalClassifier -> its LexicalWeights


@dataclass(frozen=True)
class Explanation:
    """One text's explanation: ``items`` (word or n-gram -> contribution to the log-odds), the log-odds itself and
    at the reference input (NBSVM: the intercept; a Transformer: the all-[PAD] review), so that ``sum(items)`` is
    ``log_odds - reference`` (exactly for NBSVM, up to the path sum's error for integrated gradients)."""

    items: dict[str, float]
    log_odds: float
    reference: float
    words: tuple[tuple[str, float], ...] = ()  # the text's words in order with their contributions (for pages)


def explanation_text(items: dict[str, float], top: int = TOP_ITEMS) -> str:
    """The ``top`` items with the largest absolute contributions, signed and ordered: ``+great, +loved, -boring``
    (ties by name). Left out: items that moved nothing, and punctuation other than ``!`` and ``?`` (a ``.`` or ``,``
    the Transformer leans on is not a reason a reader can act on; the errors page still colours it)."""
    ranked = sorted(
        (item for item in items.items() if item[1] != 0.0 and _WORDLIKE.search(item[0])),
        key=lambda item: (-abs(item[1]), item[0]),
    )
    return ", ".join(f"{'+' if value > 0 else '-'}{name}" for name, value in ranked[:top])


def log_odds(log_probabilities: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``log p_t - mean_{j != t} log p_j`` per row, for the target class ``t`` of each row."""
    log_probabilities = np.asarray(log_probabilities, dtype=np.float64)
    rows = np.arange(len(log_probabilities))
    others = (log_probabilities.sum(axis=1) - log_probabilities[rows, target]) / (log_probabilities.shape[1] - 1)
    return log_probabilities[rows, target] - others


def target_classes(probabilities: np.ndarray) -> np.ndarray:
    """The class each row is explained towards: the second for two classes, the predicted one for more."""
    probabilities = np.asarray(probabilities)
    if probabilities.shape[1] == 2:
        return np.ones(len(probabilities), dtype=np.int64)
    return probabilities.argmax(axis=1)


# --------------------------------------------------------------------------- NBSVM: exact


def lexical_explanations(lexical, counts, texts: Sequence[str] | None = None) -> list[Explanation]:
    """Explanations of a ``LexicalClassifier`` for the n-gram ``counts`` its ``prepare`` made; with ``texts`` (cleaned
    as ``prepare`` cleans them) each also lists the text's words in order, an n-gram's contribution shared equally
    among the words of each of its occurrences."""
    weights = _NBSVM_WEIGHTS.get(lexical)
    if weights is None:  # the feature names and weights, once per loaded model
        weights = _NBSVM_WEIGHTS[lexical] = lexical.weights("explanations")
    counts = counts.tocsr()
    # two classes: towards the second, whatever the scores; more: towards the predicted class
    targets = (
        np.ones(counts.shape[0], dtype=np.int64) if len(lexical.labels) == 2 else target_classes(lexical.score(counts))
    )
    explanations = []
    for row, target in enumerate(targets):
        regression = 0 if weights.weights.shape[1] == 1 else int(np.flatnonzero(weights.classes == target)[0])
        start, end = counts.indptr[row], counts.indptr[row + 1]
        columns, values = counts.indices[start:end], counts.data[start:end]
        contributions = weights.weights[columns, regression] * values
        items = {weights.features[c]: float(v) for c, v in zip(columns, contributions)}
        intercept = float(weights.intercepts[regression])
        words = () if texts is None else lexical_words(texts[row], items, weights)
        explanations.append(Explanation(items, intercept + float(contributions.sum()), intercept, words))
    return explanations


def lexical_words(text: str, items: dict[str, float], weights) -> tuple[tuple[str, float], ...]:
    """``text``'s NBSVM tokens in order, each with its share of the contributions of the n-grams it is part of."""
    from pipeline.lexical import NBSVM_TOKEN_PATTERN

    tokens = re.findall(NBSVM_TOKEN_PATTERN, text.lower() if weights.lowercase else text)
    low, high = weights.ngram_range
    spans = [(i, n, " ".join(tokens[i : i + n])) for n in range(low, high + 1) for i in range(len(tokens) - n + 1)]
    occurrences: dict[str, int] = {}
    for _, _, gram in spans:
        occurrences[gram] = occurrences.get(gram, 0) + 1
    scores = np.zeros(len(tokens))
    for i, n, gram in spans:
        if gram in items:
            scores[i : i + n] += items[gram] / (n * occurrences[gram])
    return tuple(zip(tokens, scores.tolist()))


# --------------------------------------------------------------------------- Transformer: integrated gradients


def _embedding_layers(model):
    """The layers whose outputs are the token vectors (``token_embedding``, in the model or a preset's backbone) and
    the hashed n-gram vectors (``ngram_embedding``, the own encoder's, when it has one)."""
    # every nested layer: a preset's backbone may hold its token embedding inside another layer (DistilBERT's
    # token-and-position embedding), whose call then calls the one replaced here
    layers = {layer.name: layer for layer in model._flatten_layers(include_self=False, recursive=True)}
    if "token_embedding" not in layers:
        raise InputError(f"explanations: model {model.name!r} has no layer named token_embedding to integrate over")
    return layers["token_embedding"], layers.get("ngram_embedding")


@contextlib.contextmanager
def _outputs_given(values: dict):
    """While inside, each layer in ``values`` returns ``values[layer]["value"]`` instead of computing its output:
    the rest of the model (positions, blocks, pooling, head, padding mask from the ids) runs unchanged on it."""
    for layer, slot in values.items():
        layer.call = lambda *args, _slot=slot, **kwargs: _slot["value"]
    try:
        yield
    finally:
        for layer in values:
            del layer.call


def _gradients(function, inputs: list):
    """``function(inputs)`` (a scalar) and its gradients with respect to each of ``inputs``, on the Keras backend in
    use."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(inputs)
            value = function(inputs)
        return value, tape.gradient(value, inputs)
    if backend == "jax":
        import jax

        return jax.value_and_grad(function)(inputs)
    raise ConfigError(f"explanations need gradients, computed on the tensorflow or jax Keras backend, not {backend}")


def integrated_gradients(
    model, ids: np.ndarray, vocabulary: Sequence[str], steps: int = IG_STEPS, targets: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-position attributions ``[N, length]`` of ``model`` on token ``ids`` towards ``targets`` (default
    :func:`target_classes`), and the log-odds ``[N]`` at the ids and at the all-[PAD] reference.

    Rows go through in groups of similar length, each cut to its longest row (padding changes nothing, and a short
    text then costs what its tokens cost, not the longest text's).
    """
    if steps < 1:
        raise ConfigError(f"explanations: integrated gradients need 1 or more steps, got {steps}")
    ids = np.asarray(ids, dtype=np.int32)
    layers = [layer for layer in _embedding_layers(model) if layer is not None]
    special_ids = [i for i, token in enumerate(vocabulary) if token in SPECIAL_TOKENS]
    real = ids != PAD_ID
    widths = np.where(real.any(axis=1), ids.shape[1] - np.argmax(real[:, ::-1], axis=1), 1)
    attributions = np.zeros(ids.shape, dtype=np.float64)
    at_text, at_reference = np.zeros(len(ids)), np.zeros(len(ids))
    rows_per_pass = max(1, sequences_per_pass(model, int(widths.max())) // steps)
    order = np.argsort(widths, kind="stable")
    for start in range(0, len(ids), rows_per_pass):
        rows = order[start : start + rows_per_pass]
        width = int(widths[rows].max())
        given = None if targets is None else np.asarray(targets)[rows]
        group, at_text[rows], at_reference[rows] = _group_attributions(
            model, layers, ids[rows, :width], np.isin(ids[rows, :width], special_ids), steps, given
        )
        attributions[rows, :width] = group
    return attributions, at_text, at_reference


def sequences_per_pass(model, width: int) -> int:
    """Interpolated sequences of ``width`` tokens per forward and backward pass: :data:`IG_BATCH`, fewer where the
    activations a gradient keeps would pass :data:`IG_MEMORY_FLOATS`. Per token and encoder block that is about
    12 floats per feed-forward unit and 6 per attention head and key (measured on all-MiniLM-L6-v2: 0.72 MB a token
    against 0.66 MB so estimated)."""
    from pipeline.model.transformer import encoder_blocks

    blocks = encoder_blocks(preset_backbone_of(model) or model)  # a preset's blocks are inside its backbone
    per_token = sum(12 * block.intermediate_dim + 6 * block.num_heads * width for block in blocks)
    return int(min(IG_BATCH, max(1, IG_MEMORY_FLOATS // max(1, per_token * width))))


def _group_attributions(
    model, layers: list, ids: np.ndarray, special: np.ndarray, steps: int, targets: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`integrated_gradients` for one group of rows: attributions ``[rows, width]``, log-odds at the text and at
    the reference."""
    import keras
    from keras import ops

    reference_ids = np.where(special, ids, PAD_ID).astype(np.int32)
    # the embedding layers' own outputs for the text and the reference (the n-grams ending at [CLS] are the same)
    vectors = [(layer(ids), layer(reference_ids)) for layer in layers]
    slots: dict[object, dict[str, object]] = {layer: {} for layer in layers}

    def outputs(given, batch_ids):
        for layer, value in zip(layers, given):
            slots[layer]["value"] = value
        with _outputs_given(slots):
            return forward_pass(model, batch_ids)

    probabilities = ops.convert_to_numpy(outputs([v for v, _ in vectors], ids))
    targets = target_classes(probabilities) if targets is None else targets
    at_text = log_odds(np.log(np.clip(probabilities, 1e-30, 1.0)), targets)
    at_reference = log_odds(
        np.log(np.clip(ops.convert_to_numpy(outputs([r for _, r in vectors], ids)), 1e-30, 1.0)), targets
    )
    count, alphas = len(ids), (np.arange(steps) + 0.5) / steps
    batch_ids = np.repeat(ids, steps, axis=0)
    scale = ops.convert_to_tensor(np.tile(alphas, count).reshape(-1, 1, 1), dtype="float32")
    deltas = [ops.cast(v, "float32") - ops.cast(r, "float32") for v, r in vectors]
    points = [
        ops.repeat(ops.cast(r, "float32"), steps, axis=0) + scale * ops.repeat(d, steps, axis=0)
        for (_, r), d in zip(vectors, deltas)
    ]
    one_hot = keras.ops.one_hot(np.repeat(targets, steps), probabilities.shape[1])
    others = (1.0 - one_hot) / (probabilities.shape[1] - 1)

    def total(given):
        logs = ops.log(ops.clip(ops.cast(outputs(given, batch_ids), "float32"), 1e-30, 1.0))
        return ops.sum(logs * one_hot) - ops.sum(logs * others)

    _, gradients = _gradients(total, points)
    attributions = np.zeros(ids.shape, dtype=np.float64)
    for delta, gradient in zip(deltas, gradients):
        mean = ops.mean(ops.reshape(gradient, (count, steps, *gradient.shape[1:])), axis=1)
        attributions += ops.convert_to_numpy(ops.sum(delta * mean, axis=-1)).astype(np.float64)
    return attributions, at_text, at_reference


def word_attributions(
    ids: np.ndarray, attributions: np.ndarray, vocabulary: Sequence[str]
) -> tuple[tuple[str, float], ...]:
    """One row's words in order with their attributions: word pieces (``##``) joined to their word, special tokens
    and padding left out."""
    words: list[list] = []
    for token_id, value in zip(ids, attributions):
        if token_id == PAD_ID:
            continue
        token = vocabulary[token_id]
        if token in SPECIAL_TOKENS:
            continue
        if token.startswith(PIECE_PREFIX) and words:
            words[-1][0] += token[len(PIECE_PREFIX) :]
            words[-1][1] += float(value)
        else:
            words.append([token, float(value)])
    return tuple((word, value) for word, value in words)


def transformer_explanations(transformer, prepared, steps: int = IG_STEPS) -> list[Explanation]:
    """Explanations of a ``SentimentClassifier`` for what its ``prepare`` made: ids, or (ids, owner) when it reads
    long reviews by windows (then a text's explanation is the mean of its rows', as its log-odds is)."""
    ids, owner = prepared if isinstance(prepared, tuple) else (prepared, np.arange(len(prepared)))
    vocabulary = transformer.text_tokenizer.vocabulary
    if len(ids) == 0:
        return []
    attributions, at_text, at_reference = integrated_gradients(transformer.model, ids, vocabulary, steps)
    words = [
        word_attributions(row_ids, row_attributions, vocabulary) for row_ids, row_attributions in zip(ids, attributions)
    ]
    explanations = []
    for text in range(int(np.max(owner)) + 1):
        rows = np.flatnonzero(owner == text)
        items: dict[str, float] = {}
        for row in rows:
            for word, value in words[row]:
                items[word] = items.get(word, 0.0) + value / len(rows)
        explanations.append(
            Explanation(items, float(at_text[rows].mean()), float(at_reference[rows].mean()), words[rows[0]])
        )
    return explanations


# --------------------------------------------------------------------------- any pipeline model


def fused_explanation(transformer: Explanation, lexical: Explanation, weight: float) -> Explanation:
    """The fusion's explanation: each part's items, log-odds and reference weighted by its fusion weight."""
    items = {name: weight * value for name, value in transformer.items.items()}
    for name, value in lexical.items.items():
        items[name] = items.get(name, 0.0) + (1.0 - weight) * value
    return Explanation(
        items,
        weight * transformer.log_odds + (1.0 - weight) * lexical.log_odds,
        weight * transformer.reference + (1.0 - weight) * lexical.reference,
    )
