"""Where biLM weights come from: registered loaders for `[initialize.components.elmo.weights]`."""

from pathlib import Path
from typing import Callable

from spacy.util import registry

from .bilm import BiLM

BUNDLED_MODEL = Path(__file__).parent / "data" / "en_elmo_bundled"
# The bundled model's files (a `spacy-elmo pretrain` model directory, less its pretrain.json
# that documents them) and the most bytes they may take together.
BUNDLED_FILES = ("config.json", "model.safetensors", "lm_head.safetensors", "vocab.txt")
BUNDLED_MAX_BYTES = 25 * 10**6


@registry.misc("spacy_elmo.AllenNLPWeights.v1")
def allennlp_weights(options_file: Path, weights_file: Path) -> Callable[[], BiLM]:
    """The published AllenNLP/bilm-tf files: options.json and the weights hdf5."""

    def load() -> BiLM:
        return BiLM.from_allennlp(options_file, weights_file)

    load.source = f"{options_file} + {weights_file}"  # type: ignore[attr-defined]
    return load


@registry.misc("spacy_elmo.SavedBiLM.v1")
def saved_bilm(path: Path) -> Callable[[], BiLM]:
    """A directory written by `BiLM.save` or `spacy-elmo pretrain` (its `model/` folder)."""

    def load() -> BiLM:
        return BiLM.load(path)

    load.source = str(path)  # type: ignore[attr-defined]
    return load


def bundled_bilm(stateful: bool = False) -> BiLM:
    """The English biLM that ships in the package."""
    if not (BUNDLED_MODEL / "model.safetensors").exists():
        raise ValueError(
            f"the bundled English biLM is not in this installation ({BUNDLED_MODEL}); give "
            "weights in the config: [initialize.components.elmo.weights] with "
            '@misc = "spacy_elmo.AllenNLPWeights.v1" (options_file, weights_file) or '
            '"spacy_elmo.SavedBiLM.v1" (path)'
        )
    return BiLM.load(BUNDLED_MODEL, stateful=stateful)


@registry.misc("spacy_elmo.ElmoForManyLangsWeights.v1")
def elmoformanylangs_weights(path: Path) -> Callable[[], BiLM]:
    """An ELMoForManyLangs model directory (HIT-SCIR, 44 languages): config.json, the
    architecture JSON, char.dic, word.dic, token_embedder.pkl and encoder.pkl."""

    def load() -> BiLM:
        return BiLM.from_elmoformanylangs(path)

    load.source = str(path)  # type: ignore[attr-defined]
    return load
