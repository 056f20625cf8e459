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
from spacy_elmo.pipeline.architectures import ElmoModel, set_unit_rule

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


def tiny_model():
    """ElmoModel.v1 with the tiny architecture and the rule its owner would set."""
    model = ElmoModel(**TINY_MODEL_CONFIG)
    set_unit_rule(model, split_sentences=False, sentence_punct=None)
    return model


def test_the_model_alone_has_no_sentence_rule_until_its_owner_sets_one(bilm_dir, monkeypatch):
    model = ElmoModel(**TINY_MODEL_CONFIG)
    monkeypatch.setattr(elmo_model, "default_bilm", CountingLoader(bilm_dir))
    model.initialize()
    with pytest.raises(ValueError, match="the elmo model has no sentence rule"):
        model.predict(docs(spacy.blank("en").vocab))


def test_the_run_settings_are_not_saved_with_the_model(bilm_dir, monkeypatch):
    """The config is their one owner: a model built with other settings keeps its own when it
    reads the bytes of this one."""
    model = tiny_model()
    monkeypatch.setattr(elmo_model, "default_bilm", CountingLoader(bilm_dir))
    model.initialize()
    other = ElmoModel(**TINY_MODEL_CONFIG, max_tokens=3, batch_tokens=5, store_dtype="float16")
    set_unit_rule(other, split_sentences=True, sentence_punct=[";"])
    other.from_bytes(model.to_bytes())
    assert (other.attrs["settings"].max_tokens, other.attrs["settings"].store_dtype) == (
        3,
        "float16",
    )
    assert other.attrs["settings"].sentence_punct == (";",)
    assert other.attrs["weights_loaded"]


def test_weights_are_loaded_at_initialize_not_in_the_forward_pass(bilm_dir, monkeypatch):
    model = tiny_model()
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
    model = tiny_model()
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
