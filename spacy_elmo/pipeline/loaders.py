"""Where biLM weights come from: registered loaders for `[initialize.components.elmo.weights]`.

Each reads its biLM through `weights.sources`, the resolver every entry point uses.
"""

from pathlib import Path
from typing import Callable

from spacy.util import registry

from ..bilm import BiLM
from ..weights.published import ensure, published_model
from ..weights.sources import BUNDLED_DIR, resolve_source

BUNDLED_MODEL = BUNDLED_DIR
# The bundled model's files (a `spacy-elmo pretrain` model directory, less its pretrain.json
# that documents them) and the most bytes they may take together.
BUNDLED_FILES = ("config.json", "model.safetensors", "lm_head.safetensors", "vocab.txt")
BUNDLED_MAX_BYTES = 25 * 10**6


def _loader(name: str, *source_args: object, efml_only: bool = False) -> Callable[[], BiLM]:
    """A loader that resolves its biLM when called (at `initialize`), not when configured."""

    def load() -> BiLM:
        source = resolve_source(*source_args)
        if efml_only and source.kind != "elmoformanylangs":
            raise ValueError(
                f"{name} is not an ELMoForManyLangs model directory (it is "
                f"{source.describe()}); use spacy_elmo.SavedBiLM.v1 for it"
            )
        return BiLM.load(source)

    load.source = name  # type: ignore[attr-defined]
    return load


@registry.misc("spacy_elmo.AllenNLPWeights.v1")
def allennlp_weights(options_file: Path, weights_file: Path) -> Callable[[], BiLM]:
    """The published AllenNLP/bilm-tf files: options.json and the weights hdf5."""
    return _loader(f"{options_file} + {weights_file}", None, options_file, weights_file)


@registry.misc("spacy_elmo.PublishedWeights.v1")
def published_weights(name: str) -> Callable[[], BiLM]:
    """A published AllenNLP biLM by name (small, medium, original, original-5.5b), read from
    the cache and downloaded into it first when missing (`weights.published`)."""
    published_model(name)  # an unknown name fails when the config is read

    def load() -> BiLM:
        ensure(name)
        return BiLM.load(name)

    load.source = name  # type: ignore[attr-defined]
    return load


@registry.misc("spacy_elmo.SavedBiLM.v1")
def saved_bilm(path: Path) -> Callable[[], BiLM]:
    """A biLM directory: written by `BiLM.save`, a `spacy-elmo pretrain` run directory (or its
    `model/`), a bilm-tf/AllenNLP folder or an ELMoForManyLangs directory (`weights.sources`)."""
    return _loader(str(path), path)


@registry.misc("spacy_elmo.ElmoForManyLangsWeights.v1")
def elmoformanylangs_weights(path: Path) -> Callable[[], BiLM]:
    """An ELMoForManyLangs model directory (HIT-SCIR, 44 languages): config.json, the
    architecture JSON, char.dic, word.dic, token_embedder.pkl and encoder.pkl."""
    return _loader(str(path), path, efml_only=True)
