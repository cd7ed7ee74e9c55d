"""Adversarial training on the embeddings (``training.adversarial_epsilon``): the perturbation raises the loss, the
wrapper trains the classifier's own weights, and only the plain classifier is saved and scored."""

import json

import keras
import mlflow
import numpy as np
import pytest

from pipeline.config import Config, ModelConfig
from pipeline.core.errors import ConfigError
from pipeline.model.adversarial import AdversarialClassifier, classifier_of
from pipeline.model.classifiers import load_keras_model
from pipeline.model.fit import compile_model
from pipeline.model.transformer import build_model
from pipeline.stages import train
from pipeline.stages.train.fit_and_log import run_directory


def tiny_classifier(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return build_model(
        ModelConfig(
            hidden_dim=8,
            num_heads=2,
            intermediate_dim=16,
            ngram_buckets=64,
            dropout=0.0,
            classifier_dropout=0.0,
            ngram_dropout=0.0,
        ),
        30,
        16,
        2,
    )


def batch():
    ids = np.random.default_rng(0).integers(5, 30, (16, 10)).astype("int32")
    return ids, (ids[:, 1] > 17).astype("int32")


def test_moving_along_the_gradient_raises_the_loss_more_the_further_it_goes():
    ids, labels = batch()
    config = Config().with_settings([("training.pseudo_labels", False)])
    losses = []
    for epsilon in (0.05, 0.5, 2.0):
        model = compile_model(AdversarialClassifier(tiny_classifier(), epsilon), config.training, False, 4)
        clean = float(model.compute_loss(ids, labels, model(ids, training=True), training=False))
        losses.append(float(model.perturbed_loss(ids, labels)))
    assert clean < losses[0] < losses[1] < losses[2], (clean, losses)


def test_the_wrapper_shares_the_classifiers_weights_and_fits_them():
    ids, labels = batch()
    classifier = tiny_classifier()
    model = AdversarialClassifier(classifier, 1.0)
    assert [id(w) for w in model.weights] == [id(w) for w in classifier.weights]  # the same variables, once each
    assert classifier_of(model) is classifier and classifier_of(classifier) is classifier
    before = [w.numpy().copy() for w in classifier.trainable_weights]
    compile_model(model, Config().training, False, 2)
    history = model.fit(ids, labels, epochs=2, batch_size=8, verbose=0, validation_data=(ids, labels))
    changed = [not np.allclose(b, w.numpy()) for b, w in zip(before, classifier.trainable_weights)]
    assert sum(changed) >= len(changed) - 1  # every weight the batches reach moved (padding's row may not)
    # training loss holds the clean and the perturbed loss; validation's only the clean one
    assert history.history["loss"][0] > 1.5 * history.history["val_loss"][0]
    np.testing.assert_allclose(model.predict(ids, verbose=0), classifier.predict(ids, verbose=0))
    with pytest.raises(ValueError, match="epsilon > 0"):
        AdversarialClassifier(classifier, 0.0)


def test_a_run_trained_adversarially_saves_and_scores_the_plain_classifier(prepared_config):
    config = prepared_config.replace(training={"adversarial_epsilon": 1.0, "epochs": 1})
    run_dir = train.run(config)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    run = mlflow.tracking.MlflowClient().get_run(manifest["mlflow_run_id"])
    assert run.data.params["training.adversarial_epsilon"] == "1.0"
    model = load_keras_model(run_dir / "model.keras")
    assert not isinstance(model, AdversarialClassifier) and model.get_layer("embedding_norm")
    probabilities = np.asarray(model.predict(np.array([[2, 7, 8, 9]], dtype="int32"), verbose=0))
    assert probabilities.reshape(-1, 2).sum(axis=1) == pytest.approx([1.0])
    plain_dir, _, _ = run_directory(config.replace(training={"adversarial_epsilon": 0.0}), config.data_dir / "tokenize")
    assert plain_dir != run_dir  # another setting, another run


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_a_bad_epsilon_names_the_key(value):
    from pipeline.config import load_config

    with pytest.raises(ConfigError, match="training.adversarial_epsilon"):
        load_config(None, [f"training.adversarial_epsilon={value}"])
