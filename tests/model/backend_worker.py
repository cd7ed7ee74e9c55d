"""What the cross-backend tests run in a process of another Keras backend (``KERAS_BACKEND`` is read once, at the
first ``import keras``): ``python -m tests.model.backend_worker COMMAND[,COMMAND...] FOLDER`` (one process for
several commands: each start of Keras and its backend costs seconds). Each command reads and writes its own
sub-folder of ``FOLDER``, named as the command.

- ``hash FOLDER``: the n-gram bucket ids of ``FOLDER/ids.npy`` for each bucket count of ``FOLDER/buckets.npy``
  (``hashes_<buckets>.npy``).
- ``predict FOLDER``: the class probabilities of ``FOLDER/model.keras`` on ``FOLDER/ids.npy`` (``probabilities.npy``).
- ``train FOLDER``: the tests' tiny own encoder (2-3-grams in a 97-row table) after one training step on
  ``FOLDER/ids.npy`` and ``labels.npy``, saved as ``model.keras`` with its probabilities (``probabilities.npy``) and
  the step's loss and weight change (``step.json``).
- ``lazy-step FOLDER``: ``FOLDER/model.keras`` after one ``LazyAdamW`` step on ``ids.npy`` and ``labels.npy``
  (``weights.npz``, by variable path) and its probabilities then (``probabilities.npy``).
- ``train-preset FOLDER``: the same step for a classifier on the KerasHub preset in ``FOLDER/preset`` (``step.json``).
- ``explain FOLDER``: integrated gradients of ``FOLDER/model.keras`` on ``ids.npy`` over the vocabulary
  ``vocabulary.json`` (``attributions.npy``, ``log_odds.npy``, ``reference.npy``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def tiny_config():
    from pipeline.config import ModelConfig

    return ModelConfig(
        pooling="mean",
        hidden_dim=16,
        num_layers=1,
        num_heads=2,
        intermediate_dim=32,
        dropout=0.1,
        classifier_dropout=0.1,
        ngram_max=3,
        ngram_buckets=97,
        ngram_dropout=0.2,
    )


def one_step(model, ids: np.ndarray, labels: np.ndarray) -> dict:
    """One optimizer step on ``ids``: its loss and how far the weights moved."""
    import keras

    before = [np.array(w) for w in model.get_weights()]
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="sparse_categorical_crossentropy", jit_compile=True)
    loss = float(model.train_on_batch(ids, labels))
    moved = float(sum(np.abs(np.array(a) - b).sum() for a, b in zip(model.get_weights(), before)))
    return {"backend": keras.backend.backend(), "loss": loss, "weight_change": moved}


def lazy_step(model, ids: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """One step of the train stage's optimizer (lazy embedding rows, weight decay, clipping): the weights after it."""
    import keras

    from pipeline.model.optimizers import LazyAdamW, lookup_tables

    optimizer = LazyAdamW(learning_rate=1e-2, weight_decay=0.05, clipnorm=1.0)
    optimizer.lookup_tables = lookup_tables(model)
    model.compile(
        optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=keras.backend.backend() != "tensorflow"
    )
    model.train_on_batch(ids, labels)
    return {
        variable.path: np.array(variable.numpy() if hasattr(variable, "numpy") else variable.value)
        for variable in model.trainable_variables
    }


def main(command: str, folder: Path) -> None:
    import keras

    import pipeline.model.transformer as transformer  # registers the custom layers before a load

    ids = np.load(folder / "ids.npy")
    if command == "hash":
        for buckets in np.load(folder / "buckets.npy").tolist():
            hashes = transformer.hashed_ngram_ids(keras.ops.convert_to_tensor(ids), 3, int(buckets))
            np.save(folder / f"hashes_{buckets}.npy", keras.ops.convert_to_numpy(hashes))
    elif command == "predict":
        model = keras.saving.load_model(folder / "model.keras")
        np.save(folder / "probabilities.npy", np.asarray(model.predict(ids, verbose=0)))
    elif command == "train":
        keras.utils.set_random_seed(0)
        model = transformer.build_model(tiny_config(), int(ids.max()) + 1, ids.shape[1])
        step = one_step(model, ids, np.load(folder / "labels.npy"))
        model.save(folder / "model.keras")
        np.save(folder / "probabilities.npy", np.asarray(model.predict(ids, verbose=0)))
        (folder / "step.json").write_text(json.dumps(step))
    elif command == "lazy-step":
        model = keras.saving.load_model(folder / "model.keras")
        np.savez(folder / "weights.npz", **lazy_step(model, ids, np.load(folder / "labels.npy")))
        np.save(folder / "probabilities.npy", np.asarray(model.predict(ids, verbose=0)))
    elif command == "train-preset":
        from pipeline.config import ModelConfig
        from pipeline.model.preset_classifier import build_preset_model, load_preset_backbone

        keras.utils.set_random_seed(0)
        backbone = load_preset_backbone(str(folder / "preset"), load_weights=True)
        model = build_preset_model(ModelConfig(preset=str(folder / "preset"), ngram_max=1), backbone)
        step = one_step(model, ids, np.load(folder / "labels.npy"))
        (folder / "step.json").write_text(json.dumps(step))
    elif command == "explain":
        from pipeline.model.explain import integrated_gradients

        model = keras.saving.load_model(folder / "model.keras")
        vocabulary = json.loads((folder / "vocabulary.json").read_text())
        for name, values in zip(
            ("attributions", "log_odds", "reference"), integrated_gradients(model, ids, vocabulary, steps=8)
        ):
            np.save(folder / f"{name}.npy", values)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    for name in sys.argv[1].split(","):
        main(name, Path(sys.argv[2]) / name)
