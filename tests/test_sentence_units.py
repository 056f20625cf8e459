"""Sentence units on raw text equal those of training (issue 11, part 3): `split_sentences`."""

from __future__ import annotations

import numpy as np
import pytest
from spacy.tokens import Doc

from spacy_elmo import BiLM

from .pipeline_util import tiny_nlp

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
    nlp = tiny_nlp(bilm_dir, model={"split_sentences": True}, set_tensor=True)
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
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    assert nlp.config["components"]["elmo"]["model"]["split_sentences"] is False
    doc = nlp(TEXT)
    whole = bilm.embed([[t.text for t in doc]])[0]
    np.testing.assert_allclose(doc._.elmo_layers, whole, atol=1e-5, rtol=0)
    # The sentences see each other: their vectors differ from those they get alone.
    assert not np.allclose(doc._.elmo_layers[:, :4], bilm.embed([SENTENCES[0]])[0], atol=1e-3)


def test_a_one_sentence_doc_is_one_unit_with_or_without_the_rule(splitting, bilm_dir):
    plain = tiny_nlp(bilm_dir)
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
    nlp = tiny_nlp(bilm_dir, model={"split_sentences": True, "sentence_punct": [";"]})
    nlp.initialize()
    doc = nlp(Doc(nlp.vocab, words=["a", ".", "b", ";", "c", "d"]))
    expected = np.concatenate(bilm.embed([["a", ".", "b", ";"], ["c", "d"]]), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)
