"""ELMo layers and vectors after retokenising downstream of the `elmo` component: a merged
token's layers are the mean of its parts' (whitespace tokens left out), each piece of a split
token has the original token's layers; checked against NumPy on the layers the biLM wrote."""

from __future__ import annotations

import numpy as np
import pytest
from spacy.tokens import Doc, DocBin

from .pipeline_util import tiny_nlp

WORDS = ["Anna", "met", "New", "York", "bankers", "at", "the", "river", "bank", "."]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def merged_reference(layers: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """(L + 1, len(groups), D): each group's mean of the original tokens' layers."""
    layers = layers.astype(np.float64)
    return np.stack([layers[:, group].mean(axis=1) for group in groups], axis=1)


@pytest.fixture(scope="module")
def nlp(bilm_dir):
    nlp = tiny_nlp(bilm_dir, vector_hooks=True, vector_layer="average", mix_weights=[1, 2, 5])
    nlp.initialize()
    return nlp


def test_tokens_after_a_merge_keep_their_own_layers_and_vectors(nlp):
    doc = nlp(Doc(nlp.vocab, words=WORDS))
    original = doc._.elmo_layers.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[2:4])  # "New York"
        retokenizer.merge(doc[6:9])  # "the river bank"
    assert [t.text for t in doc] == ["Anna", "met", "New York", "bankers", "at"] + [
        "the river bank",
        ".",
    ]
    groups = [[0], [1], [2, 3], [4], [5], [6, 7, 8], [9]]
    expected = merged_reference(original, groups)
    assert doc._.elmo_layers.shape == (3, 7, original.shape[2])
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-6)
    coefficients = np.asarray(doc._.elmo_mix_coefficients, dtype=np.float64)
    for token in doc:
        np.testing.assert_allclose(token._.elmo_layers, expected[:, token.i], atol=1e-6)
        np.testing.assert_allclose(token.vector, expected[:, token.i].mean(0), atol=1e-6)
        np.testing.assert_allclose(token._.elmo, coefficients @ expected[:, token.i], atol=1e-5)
    # "bankers" (4) is not "York" (3), the token before it, which the layers held at 3
    np.testing.assert_allclose(doc[3].vector, original[:, 4].mean(0), atol=1e-6)
    assert not np.allclose(doc[3].vector, original[:, 3].mean(0), atol=1e-3)
    np.testing.assert_allclose(doc[3:6]._.elmo_layers, expected[:, 3:6], atol=1e-6)
    np.testing.assert_allclose(doc[3:6].vector, expected[:, 3:6].mean((0, 1)), atol=1e-6)
    np.testing.assert_allclose(doc.vector, expected.mean((0, 1)), atol=1e-6)
    np.testing.assert_allclose(doc._.elmo, np.einsum("l,lnd->nd", coefficients, expected), 1e-5)
    other = nlp(Doc(nlp.vocab, words=["bankers", "lend", "money"]))
    a, b = expected[:, 3].mean(0), other._.elmo_layers[:, 0].astype(np.float64).mean(0)
    assert doc[3].similarity(other[0]) == pytest.approx(cosine(a, b), rel=1e-5)


def test_merge_entities_and_merge_noun_chunks_downstream_of_elmo(bilm_dir):
    nlp = tiny_nlp(bilm_dir, pipeline=("elmo", "entity_ruler", "merge_entities"), vector_hooks=True)
    nlp.initialize()
    pattern = [{"ORTH": "New"}, {"ORTH": "York"}]
    nlp.get_pipe("entity_ruler").add_patterns([{"label": "GPE", "pattern": pattern}])
    words = ["the", "river", "bank", "in", "New", "York", "flooded"]
    layers = nlp.get_pipe("elmo").model.predict([Doc(nlp.vocab, words=words)])[0]
    doc = nlp(Doc(nlp.vocab, words=words))
    assert [t.text for t in doc] == ["the", "river", "bank", "in", "New York", "flooded"]
    expected = merged_reference(layers, [[0], [1], [2], [3], [4, 5], [6]])
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5)

    chunks = tiny_nlp(bilm_dir, pipeline=("elmo", "merge_noun_chunks"), vector_hooks=True)
    chunks.initialize()
    parsed = Doc(
        chunks.vocab,
        words=words,
        pos=["DET", "NOUN", "NOUN", "ADP", "PROPN", "PROPN", "VERB"],
        heads=[2, 2, 6, 2, 5, 3, 6],
        deps=["det", "compound", "nsubj", "prep", "compound", "pobj", "ROOT"],
    )
    doc = chunks(parsed)
    assert [t.text for t in doc] == ["the river bank", "in", "New York", "flooded"]
    expected = merged_reference(layers, [[0, 1, 2], [3], [4, 5], [6]])
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5)
    np.testing.assert_allclose(doc[3]._.elmo_layers, layers[:, 6], atol=1e-5)


def test_split_pieces_get_the_original_tokens_layers_and_a_merge_is_undone(nlp):
    doc = nlp(Doc(nlp.vocab, words=WORDS))
    original = doc._.elmo_layers.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.split(doc[4], ["bank", "ers"], heads=[(doc[4], 1), doc[3]])
    assert [t.text for t in doc][4:6] == ["bank", "ers"]
    np.testing.assert_allclose(doc[4]._.elmo_layers, original[:, 4], atol=0)
    np.testing.assert_allclose(doc[5]._.elmo_layers, original[:, 4], atol=0)
    np.testing.assert_allclose(doc[6]._.elmo_layers, original[:, 5], atol=0)
    # merging tokens and splitting them again gives the stored layers back
    words, spaces = ["We", "can", "not", "go", "."], [True, False, True, False, False]
    doc = nlp(Doc(nlp.vocab, words=words, spaces=spaces))
    original = doc._.elmo_layers.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[1:3])
        retokenizer.merge(doc[3:5])
    assert [t.text for t in doc] == ["We", "cannot", "go."]
    np.testing.assert_allclose(doc[1]._.elmo_layers, original[:, 1:3].mean(1), atol=1e-6)
    with doc.retokenize() as retokenizer:
        retokenizer.split(doc[1], ["can", "not"], heads=[(doc[1], 1), doc[2]])
        retokenizer.split(doc[2], ["go", "."], heads=[(doc[2], 1), doc[0]])
    assert [t.text for t in doc] == words
    np.testing.assert_array_equal(doc._.elmo_layers, original)


def test_whitespace_tokens_are_left_out_of_a_merge(nlp):
    doc = nlp("river  bank flooded")  # "river", " ", "bank", "flooded"
    assert doc[1].is_space
    original = doc._.elmo_layers.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[0:3])
    assert doc[0].text == "river  bank"
    expected = merged_reference(original, [[0, 2], [3]])
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-6)


def test_a_retokenised_doc_keeps_its_vectors_through_bytes_and_docbin(nlp):
    doc = nlp(Doc(nlp.vocab, words=WORDS))
    groups = [[0], [1], [2, 3]] + [[i] for i in range(4, 10)]
    expected = merged_reference(doc._.elmo_layers, groups)
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[2:4])
    restored = Doc(nlp.vocab).from_bytes(doc.to_bytes(exclude=["user_hooks"]))
    np.testing.assert_allclose(restored._.elmo_layers, expected, atol=1e-6)
    docbin = DocBin(store_user_data=True, docs=[doc])
    (restored,) = DocBin().from_bytes(docbin.to_bytes()).get_docs(nlp.vocab)
    np.testing.assert_allclose(restored[3]._.elmo_layers, expected[:, 3], atol=1e-6)


def test_layers_that_cannot_follow_the_doc_are_an_error(nlp):
    doc = nlp(Doc(nlp.vocab, words=WORDS))
    del doc.user_data[("._.", "elmo_token_offsets", None, None)]  # as a doc saved without them
    np.testing.assert_allclose(doc[4].vector, doc._.elmo_layers[:, 4].mean(0), atol=1e-6)
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[2:4])
    with pytest.raises(ValueError, match="holds 10 tokens but the doc has 9 .*retokenised"):
        doc[3].similarity(doc[0])
    with pytest.raises(ValueError, match="holds 10 tokens but the doc has 9"):
        doc[3]._.elmo_layers.sum()
    # layers set after the merge are checked against it
    with pytest.raises(ValueError, match=r"shape \(3, 9, D\)"):
        doc._.elmo_layers = np.zeros((3, 10, 16), dtype=np.float32)
