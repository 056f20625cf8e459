"""ELMo as spaCy's vectors (`vector_hooks`, `vector_layer`): token/span/doc `.vector`,
`.has_vector`, `.vector_norm` and `.similarity`, each against a NumPy computation from
`doc._.elmo_layers`; the river/finance ranking with the bundled biLM; saving and loading."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc

from spacy_elmo.vector_hooks import set_vector_hooks

from .pipeline_util import tiny_nlp

TEXTS = ["The river bank flooded after the storm .", "The investment bank lent money ."]


def numpy_vectors(layers: np.ndarray, vector_layer: str, coefficients) -> np.ndarray:
    """(L + 1, n, D) -> (n, D): the reference for each vector_layer."""
    layers = layers.astype(np.float64)
    if vector_layer == "top":
        return layers[-1]
    if vector_layer == "average":
        return layers.mean(axis=0)
    return np.einsum("l,lnd->nd", np.asarray(coefficients, dtype=np.float64), layers)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module", params=["top", "average", "mix"])
def hooked(request, bilm_dir):
    nlp = tiny_nlp(bilm_dir, vector_hooks=True, vector_layer=request.param, mix_weights=[1, 2, 5])
    nlp.initialize()
    return nlp, request.param


def test_vectors_are_the_chosen_layer_of_the_elmo_layers(hooked):
    nlp, vector_layer = hooked
    doc = nlp(TEXTS[0])
    expected = numpy_vectors(doc._.elmo_layers, vector_layer, doc._.elmo_mix_coefficients)
    for token in doc:
        assert token.has_vector
        assert token.vector.dtype == np.float32
        np.testing.assert_allclose(token.vector, expected[token.i], atol=1e-5, rtol=1e-5)
        assert token.vector_norm == pytest.approx(np.linalg.norm(expected[token.i]), rel=1e-5)
    span = doc[1:3]
    assert span.has_vector
    np.testing.assert_allclose(span.vector, expected[1:3].mean(0), atol=1e-5, rtol=1e-5)
    assert span.vector_norm == pytest.approx(np.linalg.norm(expected[1:3].mean(0)), rel=1e-5)
    assert doc.has_vector
    np.testing.assert_allclose(doc.vector, expected.mean(0), atol=1e-5, rtol=1e-5)
    assert doc.vector_norm == pytest.approx(np.linalg.norm(expected.mean(0)), rel=1e-5)
    if vector_layer == "mix":  # the component's own mix, token._.elmo
        np.testing.assert_allclose(doc[2].vector, doc[2]._.elmo, atol=1e-6)


def test_similarity_is_the_cosine_of_those_vectors_across_docs(hooked):
    nlp, vector_layer = hooked
    river, money = nlp(TEXTS[0]), nlp(TEXTS[1])
    a = numpy_vectors(river._.elmo_layers, vector_layer, river._.elmo_mix_coefficients)
    b = numpy_vectors(money._.elmo_layers, vector_layer, money._.elmo_mix_coefficients)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no W007 (Doc), W008 (no vectors) or any other
        # "bank" and "bank": no short-cut to 1.0 for equal word forms
        assert river[2].similarity(money[2]) == pytest.approx(cosine(a[2], b[2]), rel=1e-5)
        assert river[2].similarity(money[2]) < 0.9999
        assert river[2].similarity(river[2]) == pytest.approx(1.0, rel=1e-6)
        assert river[1:3].similarity(money[1:3]) == pytest.approx(
            cosine(a[1:3].mean(0), b[1:3].mean(0)), rel=1e-5
        )
        assert river.similarity(money) == pytest.approx(cosine(a.mean(0), b.mean(0)), rel=1e-5)
        # mixed kinds: a token against a span, a doc against a token
        assert river[2].similarity(money[1:3]) == pytest.approx(
            cosine(a[2], b[1:3].mean(0)), rel=1e-5
        )
        assert river.similarity(money[2]) == pytest.approx(cosine(a.mean(0), b[2]), rel=1e-5)


def test_whitespace_tokens_are_left_out_of_span_and_doc_vectors(hooked):
    nlp, vector_layer = hooked
    doc = nlp(Doc(nlp.vocab, words=["river", "\n", "bank"], spaces=[False, False, False]))
    assert doc[1].is_space and not doc._.elmo_layers[:, 1].any()  # the biLM does not read it
    expected = numpy_vectors(doc._.elmo_layers, vector_layer, doc._.elmo_mix_coefficients)
    np.testing.assert_allclose(doc.vector, expected[[0, 2]].mean(0), atol=1e-5, rtol=1e-5)
    assert doc[1:2].similarity(doc) == 0.0  # a span of whitespace only: norm 0


@pytest.mark.filterwarnings("ignore:.*W008")
def test_hooks_are_off_by_default(bilm_dir):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    doc = nlp(TEXTS[0])
    assert not doc.user_hooks and not doc.user_token_hooks and not doc.user_span_hooks
    assert doc._.elmo_vector_layer is None
    assert nlp.config["components"]["elmo"]["vector_hooks"] is False
    assert nlp.config["components"]["elmo"]["vector_layer"] == "top"
    # what the hooks replace: spaCy's word-form short-cut and its W007 without vectors
    other = nlp(TEXTS[1])
    assert doc[2].similarity(other[2]) == 1.0
    with pytest.warns(UserWarning, match="W007"):
        doc.similarity(other)


def test_bad_settings_and_bad_comparisons(bilm_dir, hooked):
    with pytest.raises(ValueError, match="vector_layer of the 'elmo' component must be one of"):
        tiny_nlp(bilm_dir, vector_hooks=True, vector_layer="first")
    nlp, _ = hooked
    doc = nlp(TEXTS[0])
    with pytest.raises(TypeError, match="a word without its sentence has no ELMo vector"):
        doc[2].similarity(nlp.vocab["bank"])
    plain = spacy.blank("en")("river bank")  # no elmo component: no layers
    with pytest.raises(ValueError, match="'bank' has no ELMo vector"):
        doc[2].similarity(plain[1])
    with pytest.raises(ValueError, match="the doc has no ELMo layers"):
        set_vector_hooks(plain, "top")
    with pytest.raises(ValueError, match="records no vector_layer"):
        set_vector_hooks(nlp.make_doc("river"))


def test_settings_and_values_survive_to_disk_and_spacy_load(bilm_dir, tmp_path):
    nlp = tiny_nlp(bilm_dir, vector_hooks=True, vector_layer="average")
    nlp.initialize()
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    assert loaded.get_pipe("elmo").cfg["vector_layer"] == "average"
    for texts in (TEXTS, TEXTS[::-1]):
        before = [nlp(t) for t in texts]
        after = [loaded(t) for t in texts]
        np.testing.assert_allclose(after[0].vector, before[0].vector, atol=1e-6)
        np.testing.assert_allclose(after[0][2].vector, before[0][2].vector, atol=1e-6)
        assert after[0][2].similarity(after[1][2]) == pytest.approx(
            before[0][2].similarity(before[1][2]), abs=1e-6
        )
    # a setting given at load wins over the saved one
    top = spacy.load(tmp_path / "p", config={"components": {"elmo": {"vector_layer": "top"}}})
    doc = top(TEXTS[0])
    np.testing.assert_allclose(doc[2].vector, doc._.elmo_layers[-1, 2], atol=1e-6)


def test_doc_bytes_drop_the_hooks_and_set_vector_hooks_puts_them_back(hooked):
    """spaCy does not serialise user hooks (it warns W109); the layers and the rule are kept
    on the doc, so `set_vector_hooks(doc)` restores the same vectors. Pickle keeps them."""
    nlp, vector_layer = hooked
    doc = nlp(TEXTS[0])
    with pytest.warns(UserWarning, match="W109"):
        data = doc.to_bytes()
    restored = Doc(nlp.vocab).from_bytes(data)
    assert "vector" not in restored.user_token_hooks
    assert restored._.elmo_vector_layer == vector_layer
    set_vector_hooks(restored)
    np.testing.assert_allclose(restored[2].vector, doc[2].vector, atol=0)
    assert restored.similarity(doc) == pytest.approx(1.0, rel=1e-6)
    unpickled = pickle.loads(pickle.dumps(doc))
    np.testing.assert_allclose(unpickled[2].vector, doc[2].vector, atol=0)


def test_river_and_finance_senses_of_bank_through_similarity():
    """The bundled biLM: across sentence frames, 'bank' is on average more similar to 'bank'
    of the same sense than of the other sense, for every vector_layer, and the numbers that
    `.similarity` gives are NumPy cosines of that layer of `doc._.elmo_layers`. (Within one
    frame the words around 'bank' weigh more than its sense for this small biLM, so the frames
    differ between the pairs compared: docs/usage.md.)"""
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"vector_hooks": True})
    senses = {"river": ["river", "muddy"], "finance": ["investment", "savings"]}
    banks = []  # (frame, sense, the token "bank")
    for frame, text in enumerate(FRAMES):
        for sense, words in senses.items():
            for word in words:
                doc = nlp(text.format(word))
                banks.append((frame, sense, doc[[t.text for t in doc].index("bank")]))
    for vector_layer in ("top", "average", "mix"):
        for _, _, bank in banks:
            set_vector_hooks(bank.doc, vector_layer)
        same, cross = [], []
        for frame_a, sense_a, a in banks:
            for frame_b, sense_b, b in banks:
                if frame_a == frame_b:
                    continue
                value = a.similarity(b)
                (same if sense_a == sense_b else cross).append(value)
        doc_a, doc_b = banks[0][2].doc, banks[-1][2].doc
        va = numpy_vectors(doc_a._.elmo_layers, vector_layer, doc_a._.elmo_mix_coefficients)
        vb = numpy_vectors(doc_b._.elmo_layers, vector_layer, doc_b._.elmo_mix_coefficients)
        i, j = banks[0][2].i, banks[-1][2].i
        assert banks[0][2].similarity(banks[-1][2]) == pytest.approx(cosine(va[i], vb[j]), rel=1e-5)
        assert np.mean(same) > np.mean(cross), (vector_layer, np.mean(same), np.mean(cross))


FRAMES = [
    "the {} bank flooded",
    "we walked to the {} bank",
    "they sat by the {} bank all day",
    "the {} bank was closed",
    "he swam to the {} bank of the lake",
    "he borrowed money from the {} bank",
]
