"""ELMo layers and vectors after retokenising downstream of the `elmo` component: a merged
token's layers are the mean of its parts' (whitespace tokens left out), each piece of a split
token has the original token's layers; checked against NumPy on the layers the biLM wrote."""

from __future__ import annotations

import random

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


def test_a_merge_split_back_with_its_space_gives_the_words_back(nlp):
    """ "New York" merged (as `merge_entities` does) and split again, which spaCy allows with
    the space as a piece of its own: "New" and "York" have their own layers, the space zeros."""
    words = ["Anna", "met", "New", "York", "bankers", "."]
    doc = nlp(Doc(nlp.vocab, words=words, spaces=[True, True, True, True, False, False]))
    original = doc._.elmo_layers.copy()
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[2:4])
    with doc.retokenize() as retokenizer:
        retokenizer.split(doc[2], ["New", " ", "York"], heads=[(doc[2], 2), (doc[2], 2), doc[1]])
    assert [t.text for t in doc] == ["Anna", "met", "New", " ", "York", "bankers", "."]
    layers = doc._.elmo_layers
    np.testing.assert_array_equal(layers[:, 2], original[:, 2])  # "New"
    np.testing.assert_array_equal(layers[:, 4], original[:, 3])  # "York"
    np.testing.assert_array_equal(layers[:, 3], np.zeros_like(original[:, 0]))  # " "
    np.testing.assert_array_equal(layers[:, [0, 1, 5, 6]], original[:, [0, 1, 4, 5]])
    assert doc[3].is_space and doc[3].vector_norm == 0.0
    np.testing.assert_allclose(doc[4].vector, original[:, 3].astype(np.float64).mean(0), atol=1e-6)
    no_space = original[:, [0, 1, 2, 3, 4, 5]].astype(np.float64).mean((0, 1))
    np.testing.assert_allclose(doc.vector, no_space, atol=1e-6)  # the space left out
    np.testing.assert_allclose(
        doc[2:5]._.elmo,
        np.einsum("l,lnd->nd", np.asarray(doc._.elmo_mix_coefficients), layers[:, 2:5]),
        atol=1e-5,
    )


def reference_layers(text: str, original: list, layers: np.ndarray, doc: Doc) -> np.ndarray:
    """Each token's mean of the layers of the original tokens of its kind (word or whitespace)
    that share a character with it, zeros where there are none: character by character."""
    owner = np.full(len(text), -1)
    for k, (start, end) in enumerate(original):
        owner[start:end] = k
    expected = np.zeros((layers.shape[0], len(doc), layers.shape[2]))
    for token in doc:
        space = token.text.isspace()
        owners = sorted(set(owner[token.idx : token.idx + len(token.text)]) - {-1})
        same = [k for k in owners if text[original[k][0] : original[k][1]].isspace() == space]
        if same:
            expected[:, token.i] = layers[:, same].astype(np.float64).mean(axis=1)
    return expected


def random_retokenising(doc: Doc, rng: random.Random) -> str:
    """Merge two or three tokens, or split one into pieces at random characters."""
    splittable = [t for t in doc if len(t.text) > 1]
    if rng.random() < 0.5 and len(doc) > 1 or not splittable:
        start = rng.randrange(len(doc) - 1)
        span = doc[start : start + rng.choice([2, 3])]
        step = f"merge {span.text!r}"
        with doc.retokenize() as retokenizer:
            retokenizer.merge(span)
        return step
    token = rng.choice(splittable)
    cuts = sorted(rng.sample(range(1, len(token.text)), rng.randint(1, len(token.text) - 1)))
    pieces = [token.text[a:b] for a, b in zip([0] + cuts, cuts + [len(token.text)])]
    step = f"split {token.text!r} into {pieces}"
    with doc.retokenize() as retokenizer:
        retokenizer.split(token, pieces, heads=[(token, 0)] * len(pieces))
    return step


@pytest.mark.parametrize("seed", range(6))
def test_merges_and_splits_in_any_order_keep_every_tokens_own_layers(nlp, seed):
    words = ["Anna", "met", "New", "York", "bankers", " ", "at", "the", "river", "bank", "\n"]
    spaces = [True, True, True, True, False, False, True, True, True, False, False]
    doc = nlp(Doc(nlp.vocab, words=words + ["today", "."], spaces=spaces + [False, False]))
    original = [(t.idx, t.idx + len(t.text)) for t in doc]
    layers = doc._.elmo_layers.copy()
    rng = random.Random(seed)
    steps = []
    for _ in range(10):
        steps.append(random_retokenising(doc, rng))
        expected = reference_layers(doc.text, original, layers, doc)
        np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-6, err_msg=str(steps))
        for token in doc:  # a token that is one of the original tokens: its own layers
            if (token.idx, token.idx + len(token.text)) in original:
                k = original.index((token.idx, token.idx + len(token.text)))
                np.testing.assert_array_equal(token._.elmo_layers, layers[:, k], str(steps))
        words = [t.i for t in doc if not t.is_space]
        mean = expected[:, words].mean((0, 1)) if words else np.zeros(layers.shape[2])
        np.testing.assert_allclose(doc.vector, mean, atol=1e-6, err_msg=str(steps))


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
    del doc.user_data["spacy_elmo.token_offsets"]  # the offsets the layers follow, lost
    with doc.retokenize() as retokenizer:
        retokenizer.merge(doc[2:4])
    with pytest.raises(ValueError, match=r"holds 10 tokens but its recorded token offsets have"):
        doc[3].similarity(doc[0])
    with pytest.raises(ValueError, match=r"token offsets have shape \(0,\)"):
        doc[3]._.elmo_layers.sum()
    # layers set after the merge are checked against it
    with pytest.raises(ValueError, match=r"shape \(3, 9, D\)"):
        doc._.elmo_layers = np.zeros((3, 10, 16), dtype=np.float32)
