"""Which classifier training fits, decided in one place: a pretrained preset's backbone under the pipeline's head,
or the pipeline's own encoder started from what it is given (a pretrained backbone), wrapped for adversarial
training when asked. Pure construction: the train stage reads the files and compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ModelConfig, TrainingConfig
from pipeline.core.errors import ConfigError
from pipeline.model.adversarial import AdversarialClassifier
from pipeline.model.preset_classifier import preset_classifier
from pipeline.model.transformer import build_model, load_backbone_weights
from pipeline.runtime.backend import check_training_settings
from pipeline.text.text_tokenizer import TextTokenizer


@dataclass(frozen=True)
class StartingWeights:
    """What the pipeline's own encoder starts from besides its initialisers (nothing, by default)."""

    backbone: dict[str, list] | None = None  # layer name -> weights: a pretrained backbone (model.init)
    backbone_source: str = ""  # where the backbone came from, for errors


@dataclass(frozen=True)
class Device:
    """What the device decides about a classifier: the dtype policy, and whether a large preset is refused."""

    on_cpu: bool
    policy: str


def uses_preset(model_config: ModelConfig, text_tokenizer: TextTokenizer) -> bool:
    """Whether the classifier is a preset's backbone: configured, or the ids were made by a preset's tokenizer."""
    return model_config.preset is not None or text_tokenizer.preset is not None


def assemble_classifier(
    model_config: ModelConfig,
    training: TrainingConfig,
    text_tokenizer: TextTokenizer,
    num_classes: int,
    device: Device,
    start: StartingWeights = StartingWeights(),
):
    """The uncompiled classifier; ``(model, names of the backbone layers loaded)``.

    Call it inside the distribution strategy's scope. A preset with ``training.adversarial_epsilon`` is refused
    (the perturbation is of the pipeline's own embeddings)."""
    if uses_preset(model_config, text_tokenizer):
        if training.adversarial_epsilon:
            raise ConfigError(
                "training.adversarial_epsilon perturbs the pipeline's own encoder's embeddings, not "
                f"a preset's (model.preset {model_config.preset}); set training.adversarial_epsilon=0"
            )
        classifier = preset_classifier(
            model_config, text_tokenizer, num_classes, on_cpu=device.on_cpu, dtype=device.policy
        )
        return classifier, []
    model = build_model(
        model_config, text_tokenizer.vocabulary_size, text_tokenizer.settings.max_sequence_length, num_classes
    )
    loaded = []
    if start.backbone is not None:
        loaded = load_backbone_weights(model, start.backbone, start.backbone_source)
    if training.adversarial_epsilon:
        check_training_settings(training.adversarial_epsilon)
        model = AdversarialClassifier(model, training.adversarial_epsilon)
    return model, loaded
