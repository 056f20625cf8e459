"""The elmo Thinc model: weights come in at initialize (or through the component), never in a
forward pass, and a forward pass leaves the model's state as it was (the frozen cache aside)."""

from __future__ import annotations

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc
from spacy.training import Example

from spacy_elmo import BiLM
from spacy_elmo.layers import elmo_model
from spacy_elmo.pipeline.architectures import ElmoModel

from ..pipeline.pipeline_util import TINY_MODEL_CONFIG

WORDS = [["the", "river", "bank"], ["Anna", "visited", "Paris", "."]]


class CountingLoader:
    """A default-weights loader that counts its calls."""

    def __init__(self, bilm_dir) -> None:
        self.bilm_dir = bilm_dir
        self.calls = 0

    def __call__(self) -> BiLM:
        self.calls += 1
        return BiLM.load(self.bilm_dir)


def docs(vocab) -> list[Doc]:
    return [Doc(vocab, words=words) for words in WORDS]


def test_weights_are_loaded_at_initialize_not_in_the_forward_pass(bilm_dir, monkeypatch):
    model = ElmoModel(**TINY_MODEL_CONFIG)
    loader = CountingLoader(bilm_dir)
    monkeypatch.setattr(elmo_model, "default_bilm", loader)
    batch = docs(spacy.blank("en").vocab)
    with pytest.raises(ValueError, match="no weights yet: initialize it first"):
        model.predict(batch)
    with pytest.raises(ValueError, match="no weights yet: initialize it first"):
        model.begin_update(batch)
    assert loader.calls == 0 and not model.attrs["weights_loaded"]
    model.initialize()
    assert loader.calls == 1 and model.attrs["weights_loaded"]
    expected = BiLM.load(bilm_dir).embed(WORDS)
    for _ in range(2):
        for got, want in zip(model.predict(batch), expected):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        model.begin_update(batch)
    model.initialize()  # weights that are there stay
    assert loader.calls == 1


def test_a_forward_pass_changes_no_attribute_but_the_cache(bilm_dir, monkeypatch):
    """Nothing is counted or loaded in a forward pass, so nothing new is serialised."""
    model = ElmoModel(**TINY_MODEL_CONFIG)
    monkeypatch.setattr(elmo_model, "default_bilm", CountingLoader(bilm_dir))
    model.initialize()
    before = {key: value for key, value in model.attrs.items() if key != "cache"}
    serialised = model.to_dict()["attrs"]
    batch = docs(spacy.blank("en").vocab)
    model.predict(batch)
    model.begin_update(batch)  # frozen: fills the cache, which is not serialised
    assert len(model.attrs["cache"].entries) == len(WORDS)
    assert {key: value for key, value in model.attrs.items() if key != "cache"} == before
    assert model.to_dict()["attrs"] == serialised


def test_the_component_without_initialize_loads_the_default_weights_once(bilm_dir, monkeypatch):
    """`nlp.add_pipe("elmo")` then `nlp(text)` (or `nlp.update`) without `nlp.initialize()`:
    the component loads the default weights (the bundled biLM; here a counting stand-in)."""
    loader = CountingLoader(bilm_dir)
    monkeypatch.setattr(elmo_model, "default_bilm", loader)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    words = ["the", "river", "bank"]
    doc = nlp(Doc(nlp.vocab, words=words))
    assert loader.calls == 1
    np.testing.assert_allclose(
        doc._.elmo_layers, BiLM.load(bilm_dir).embed([words])[0], atol=1e-6, rtol=0
    )
    list(nlp.pipe(docs(nlp.vocab)))
    assert loader.calls == 1
    fresh = spacy.blank("en")
    fresh.add_pipe("elmo")
    fresh.update([Example(doc, doc) for doc in docs(fresh.vocab)])
    assert loader.calls == 2
