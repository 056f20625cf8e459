"""Sentence units on raw text equal those of training: `split_sentences`."""

from __future__ import annotations

import numpy as np
import pytest
import spacy
from confection import ConfigValidationError
from spacy.tokens import Doc
from spacy.training import Corpus
from spacy.util import load_config, load_model_from_config

from spacy_elmo import BiLM
from spacy_elmo.pipeline.architectures import set_unit_rule

from .pipeline_util import REPO, tiny_nlp, tiny_training_config, write_train_dev

TEXT = 'The river rose. The bank closed! "Stop!" Anna said. Ben left'
# spaCy's sentencizer rule: a sentence ends after . ! ? (...) and the punctuation right after
# it, so an opening quote after "!" stays with the sentence before.
SENTENCES = [
    ["The", "river", "rose", "."],
    ["The", "bank", "closed", "!", '"'],
    ["Stop", "!", '"'],
    ["Anna", "said", "."],
    ["Ben", "left"],
]


@pytest.fixture(scope="module")
def bilm(bilm_dir):
    return BiLM.load(bilm_dir)


@pytest.fixture(scope="module")
def splitting(bilm_dir):
    nlp = tiny_nlp(bilm_dir, split_sentences=True, set_tensor=True)
    nlp.initialize()
    return nlp


def test_a_sentence_in_raw_text_gets_the_vectors_it_gets_alone(splitting, bilm):
    doc = splitting(TEXT)
    assert [t.text for t in doc] == [w for s in SENTENCES for w in s]
    assert not doc.has_annotation("SENT_START")  # the units are internal: the doc is unchanged
    start = 0
    for words in SENTENCES:
        alone = splitting(Doc(splitting.vocab, words=words))
        inside = doc._.elmo_layers[:, start : start + len(words)]
        np.testing.assert_allclose(inside, alone._.elmo_layers, atol=1e-5, rtol=0)
        np.testing.assert_allclose(inside, bilm.embed([words])[0], atol=1e-5, rtol=0)
        start += len(words)


def test_without_split_sentences_the_doc_is_one_unit(bilm_dir, bilm):
    nlp = tiny_nlp(bilm_dir, split_sentences=False)
    nlp.initialize()
    doc = nlp(TEXT)
    whole = bilm.embed([[t.text for t in doc]])[0]
    np.testing.assert_allclose(doc._.elmo_layers, whole, atol=1e-5, rtol=0)
    # The sentences see each other: their vectors differ from those they get alone.
    assert not np.allclose(doc._.elmo_layers[:, :4], bilm.embed([SENTENCES[0]])[0], atol=1e-3)


def test_a_one_sentence_doc_is_one_unit_with_or_without_the_rule(splitting, bilm_dir):
    plain = tiny_nlp(bilm_dir, split_sentences=False)
    plain.initialize()
    words = ["Anna", "visited", "the", "river", "bank", "."]
    a = splitting(Doc(splitting.vocab, words=words))._.elmo_layers
    b = plain(Doc(plain.vocab, words=words))._.elmo_layers
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_sentence_boundaries_on_the_doc_win_over_the_rule(splitting, bilm):
    words = ["The", "river", "rose", ".", "The", "bank", "closed"]
    doc = Doc(splitting.vocab, words=words, sent_starts=[True, False, False, False, False,
                                                         True, False])  # fmt: skip
    doc = splitting(doc)
    expected = np.concatenate(bilm.embed([words[:5], words[5:]]), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)


def test_the_rule_is_configurable(bilm_dir, bilm):
    nlp = tiny_nlp(bilm_dir, sentence_punct=[";"])
    nlp.initialize()
    doc = nlp(Doc(nlp.vocab, words=["a", ".", "b", ";", "c", "d"]))
    expected = np.concatenate(bilm.embed([["a", ".", "b", ";"], ["c", "d"]]), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)


# ------------------------------------------------------- one setting, on by default, at the top
def test_split_sentences_is_on_by_default_and_a_component_setting(bilm_dir, bilm):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    assert nlp.config["components"]["elmo"]["split_sentences"] is True
    assert "split_sentences" not in nlp.config["components"]["elmo"]["model"]
    doc = nlp(TEXT)
    expected = np.concatenate(bilm.embed(SENTENCES), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)
    # what a user writes, with nothing else
    blank = spacy.blank("en")
    blank.add_pipe("elmo", config={"split_sentences": False, "sentence_punct": [";"]})
    rule = blank.get_pipe("elmo").model.attrs["settings"]
    assert (rule.split_sentences, rule.sentence_punct) == (False, (";",))


def test_the_model_level_key_is_gone_with_a_clear_error(bilm_dir):
    """One setting: the old place, under [components.elmo.model], is refused by name."""
    with pytest.raises(ConfigValidationError, match="split_sentences"):
        tiny_nlp(bilm_dir, model={"split_sentences": True})
    with pytest.raises(ConfigValidationError, match="sentence_punct"):
        tiny_nlp(bilm_dir, sentence_punct=".")
    model = spacy.registry.architectures.get("spacy_elmo.ElmoModel.v1")()
    with pytest.raises(TypeError, match="sentence_punct must be null or a list"):
        set_unit_rule(model, split_sentences=True, sentence_punct=".")


def test_the_shipped_config_splits(bilm_dir):
    config = load_config(REPO / "configs" / "ner_tagger_elmo.cfg")
    assert config["components"]["elmo"]["split_sentences"] is True
    assert "split_sentences" not in config["components"]["elmo"]["model"]
    # init-config writes it too (tests/pipeline/test_init_config.py)


def test_a_saved_pipeline_keeps_the_setting_and_a_load_override_wins(bilm_dir, bilm, tmp_path):
    nlp = tiny_nlp(bilm_dir, split_sentences=False)
    nlp.initialize()
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    whole = bilm.embed([[t.text for t in loaded.make_doc(TEXT)]])[0]
    np.testing.assert_allclose(loaded(TEXT)._.elmo_layers, whole, atol=1e-5, rtol=0)
    # the saved cfg file and model attributes say false; the config given at load wins
    override = {"components": {"elmo": {"split_sentences": True}}}
    split = spacy.load(tmp_path / "p", config=override)
    assert split.get_pipe("elmo").cfg["split_sentences"] is True
    expected = np.concatenate(bilm.embed(SENTENCES), axis=1)
    np.testing.assert_allclose(split(TEXT)._.elmo_layers, expected, atol=1e-5, rtol=0)


def test_replace_listeners_copies_the_components_rule(bilm_dir, tmp_path):
    """The inline ElmoMix.v1 that replaces a listener cuts raw text as the component did,
    also after saving and loading."""
    train, dev = write_train_dev(tmp_path, 4, 2)
    config = tiny_training_config(bilm_dir, train, dev)
    config["components"]["elmo"]["split_sentences"] = False
    nlp = load_model_from_config(config, auto_fill=True)
    nlp.initialize(lambda: Corpus(train)(nlp))
    before = [t.tag_ for t in nlp(TEXT)]
    nlp.replace_listeners("elmo", "tagger", ["model.tok2vec.elmo"])
    inline = nlp.config["components"]["tagger"]["model"]["tok2vec"]["elmo"]
    assert (inline["split_sentences"], inline["sentence_punct"]) == (False, None)
    nlp.to_disk(tmp_path / "replaced")
    loaded = spacy.load(tmp_path / "replaced")
    loaded.remove_pipe("ner")
    loaded.remove_pipe("elmo")
    (inline_elmo,) = [m for m in loaded.get_pipe("tagger").model.walk() if m.name == "elmo"]
    assert inline_elmo.attrs["settings"].split_sentences is False
    assert [t.tag_ for t in loaded(TEXT)] == before


def test_the_rule_and_the_units_match_spacys_sentencizer_token_by_token():
    """The one-pass split (`rule_sentence_starts`, `doc_units`) against spaCy's own `Sentencizer`
    on random docs of sentence ends, quotes, brackets, whitespace and CJK punctuation."""
    import random

    from spacy.pipeline import Sentencizer

    from spacy_elmo.layers.elmo_model import doc_units, rule_sentence_starts

    def rule_starts(doc, punct_chars=None):
        if not len(doc):
            return []
        return rule_sentence_starts([t.text for t in doc], [t.is_punct for t in doc], punct_chars)

    vocab = spacy.blank("en").vocab
    pieces = ["Hello", ".", "!", "?", "world", '"', ")", "\n", " ", "。", "ok", "...", "U.S.", ";"]
    generator = random.Random(0)
    for _ in range(2000):
        words = [generator.choice(pieces) for _ in range(generator.randint(0, 30))]
        doc = Doc(vocab, words=words)
        guesses = Sentencizer().predict([doc])[0]
        assert rule_starts(doc) == [i for i, g in enumerate(guesses) if g]
        own = Sentencizer(punct_chars=[";", "ok"]).predict([doc])[0]
        assert rule_starts(doc, [";", "ok"]) == [i for i, g in enumerate(own) if g]
        units = doc_units(doc, 7, max_tokens=5, split_sentences=True)
        assert [i for unit in units for i in unit.positions] == [t.i for t in doc if not t.is_space]
        for unit in units:
            assert unit.doc == 7 and 1 <= len(unit.words) <= 5
            assert list(unit.words) == [doc[i].text for i in unit.positions]
            # A unit never crosses a sentence boundary of the rule.
            assert sum(bool(guesses[i]) for i in unit.positions[1:]) == 0
