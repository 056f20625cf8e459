"""Tiny biLMs and pipelines for the spaCy integration tests."""

from __future__ import annotations

import random
from pathlib import Path

import spacy
from spacy.tokens import Doc, DocBin
from spacy.util import load_config_from_str
from thinc.api import Config

from spacy_elmo import BiLM, BiLMOptions

from ..bilm.util import tiny_options

TINY = tiny_options()
TINY_MODEL_CONFIG = {
    "char_embedding_dim": TINY["char_cnn"]["embedding"]["dim"],
    "filters": TINY["char_cnn"]["filters"],
    "n_highway": TINY["char_cnn"]["n_highway"],
    "lstm_dim": TINY["lstm"]["dim"],
    "projection_dim": TINY["lstm"]["projection_dim"],
    "n_layers": TINY["lstm"]["n_layers"],
}
TINY_WIDTH = 2 * TINY["lstm"]["projection_dim"]


def save_tiny_bilm(directory: Path, seed: int = 0) -> BiLM:
    import torch

    torch.manual_seed(seed)
    bilm = BiLM(BiLMOptions.from_dict(tiny_options()))
    bilm.save(directory)
    return bilm


def tiny_nlp(bilm_dir: Path, *, pipeline=("elmo",), **elmo_config) -> spacy.Language:
    """A blank English pipeline whose elmo component holds the tiny biLM of `bilm_dir`."""
    nlp = spacy.blank("en")
    model = {**TINY_MODEL_CONFIG, **elmo_config.pop("model", {})}
    nlp.add_pipe("elmo", config={"model": model, **elmo_config})
    for name in pipeline[1:]:
        nlp.add_pipe(name)
    nlp.config["initialize"]["components"]["elmo"] = {
        "weights": {"@misc": "spacy_elmo.SavedBiLM.v1", "path": str(bilm_dir)}
    }
    return nlp


SUBJECTS = [("Anna", "PERSON", "NNP"), ("Berlin", "GPE", "NNP"), ("the bank", None, "DT NN")]
VERBS = [("visited", "VBD"), ("likes", "VBZ"), ("left", "VBD")]
OBJECTS = [("Paris", "GPE", "NNP"), ("Ben", "PERSON", "NNP"), ("a river", None, "DT NN")]


def synthetic_docs(nlp, n: int, seed: int = 0) -> list[Doc]:
    """Sentences with gold tags, entities and sentence starts."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        subject, verb, obj = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
        words, tags, ents = [], [], []
        for text, label, tag in (subject, (verb[0], None, verb[1]), obj, (".", None, ".")):
            words += text.split()
            tags += tag.split()
            if label:
                ents.append(f"B-{label}")
                ents += [f"I-{label}"] * (len(text.split()) - 1)
            else:
                ents += ["O"] * len(text.split())
        doc = Doc(nlp.vocab, words=words, tags=tags, ents=ents)
        doc[0].is_sent_start = True
        docs.append(doc)
    return docs


def write_docbin(nlp, path: Path, n: int, seed: int) -> Path:
    DocBin(docs=synthetic_docs(nlp, n, seed)).to_disk(path)
    return path


REPO = Path(__file__).resolve().parents[2]


def tiny_training_config(bilm_dir: Path, train: Path, dev: Path, **training):
    """configs/ner_tagger_elmo.cfg with the tiny biLM and small widths."""
    from spacy import util

    config = util.load_config(REPO / "configs" / "ner_tagger_elmo.cfg")
    config["paths"]["train"] = str(train)
    config["paths"]["dev"] = str(dev)
    config["components"]["elmo"]["model"].update(TINY_MODEL_CONFIG)
    for name in ("tagger", "ner"):
        tok2vec = config["components"][name]["model"]["tok2vec"]
        tok2vec["elmo"]["width"] = TINY_WIDTH
        tok2vec["embed"].update({"width": 16, "rows": [200, 50, 50, 50]})
        tok2vec["encode"].update({"width": 16, "depth": 1})
    config["initialize"]["components"]["elmo"] = {
        "weights": {"@misc": "spacy_elmo.SavedBiLM.v1", "path": str(bilm_dir)}
    }
    config["training"].update({"max_steps": 60, "eval_frequency": 30, **training})
    config["training"]["batcher"]["size"] = 16
    return config


def write_train_dev(directory: Path, n_train: int, n_dev: int) -> tuple[Path, Path]:
    """train.spacy and dev.spacy of `synthetic_docs` (seeds 0 and 1) in `directory`."""
    blank = spacy.blank("en")
    return (
        write_docbin(blank, directory / "train.spacy", n_train, seed=0),
        write_docbin(blank, directory / "dev.spacy", n_dev, seed=1),
    )


# elmo + a tagger whose tok2vec is a listener, and nothing else: no biLM architecture, no
# listener width (both come from the weights), spaCy's defaults for the rest.
LISTENING_TAGGER_CONFIG = """
[paths]
train = null
dev = null

[nlp]
lang = null
pipeline = ["elmo", "tagger"]

[components]

[components.elmo]
factory = "elmo"

[components.tagger]
factory = "tagger"

[components.tagger.model]
@architectures = "spacy.Tagger.v2"

[components.tagger.model.tok2vec]
@architectures = "spacy_elmo.ElmoListener.v1"
upstream = "elmo"

[corpora]

[corpora.train]
@readers = "spacy.Corpus.v1"
path = ${paths.train}

[corpora.dev]
@readers = "spacy.Corpus.v1"
path = ${paths.dev}

[training]
max_steps = null
eval_frequency = null

[training.batcher]
@batchers = "spacy.batch_by_sequence.v1"
size = null

[training.optimizer]
@optimizers = "Adam.v1"
learn_rate = 0.01

[initialize]

[initialize.components]

[initialize.components.elmo]
weights = null
"""


def listening_tagger_config(
    lang: str, weights: dict, train: Path, dev: Path, *, steps: int, batch_size: int
) -> Config:
    """LISTENING_TAGGER_CONFIG for `lang`, the biLM from the `weights` loader block (an
    `@misc` dict), trained `steps` steps on batches of `batch_size` docs, evaluated twice."""
    config = load_config_from_str(LISTENING_TAGGER_CONFIG, interpolate=False)
    config["paths"].update(train=str(train), dev=str(dev))
    config["nlp"]["lang"] = lang
    config["training"].update(max_steps=steps, eval_frequency=steps // 2)
    config["training"]["batcher"]["size"] = batch_size
    config["initialize"]["components"]["elmo"]["weights"] = weights
    return config
