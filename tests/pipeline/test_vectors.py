"""ELMo as spaCy's vectors (`vector_hooks`, `vector_layer`): token/span/doc `.vector`,
`.has_vector`, `.vector_norm` and `.similarity`, each against a NumPy computation from
`doc._.elmo_layers`; the river/finance ranking with the bundled biLM; saving and loading."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc, DocBin

from spacy_elmo.pipeline.extensions import set_vector_hooks
from workflow.readme_figures import FRAMES  # the sense check's frames, one list for both

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


def assert_elmo_vectors(docs, vector_layer):
    """Each doc's hooks are ELMo's: token vectors and a cross-doc "bank"/"bank" similarity
    against NumPy on the docs' layers (spaCy alone would give zeros and 1.0)."""
    river, money = docs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no W007 / W008: the hooks answer, not spaCy
        # read before any extension (which would restore the hooks by itself)
        vector, norm = river[2].vector, river[1:3].vector_norm
        similarities = river[2].similarity(money[2]), river.similarity(money)
    a = numpy_vectors(river._.elmo_layers, vector_layer, river._.elmo_mix_coefficients)
    b = numpy_vectors(money._.elmo_layers, vector_layer, money._.elmo_mix_coefficients)
    np.testing.assert_allclose(vector, a[2], atol=1e-5, rtol=1e-5)
    assert norm == pytest.approx(np.linalg.norm(a[1:3].mean(0)), rel=1e-5)
    assert similarities[0] == pytest.approx(cosine(a[2], b[2]), rel=1e-5)
    assert similarities[0] < 0.9999
    assert similarities[1] == pytest.approx(cosine(a.mean(0), b.mean(0)), rel=1e-5)


def assert_tensor_vectors(docs, vector_layer):
    """Without hooks, spaCy serves `doc.tensor` as the vectors of a pipeline without static
    vectors: the ELMo vectors of the rule, against NumPy on the docs' layers (no whitespace
    in these texts, so spaCy's plain means are the hooks' means)."""
    for doc in docs:
        assert "vector" not in doc.user_token_hooks
        expected = numpy_vectors(
            doc.user_data["spacy_elmo.layers"], vector_layer, doc._.elmo_mix_coefficients
        )
        np.testing.assert_allclose(doc[2].vector, expected[2], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(doc[1:3].vector, expected[1:3].mean(0), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(doc.vector, expected.mean(0), atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:.*W109")
def test_docs_from_worker_processes_keep_the_vectors_and_get_the_hooks_back(hooked):
    """`nlp.pipe(n_process=2)` sends docs back as bytes, which drops spaCy's user hooks: the
    vectors come with `doc.tensor`, and `set_vector_hooks(doc)` gives ELMo's similarity back,
    also with `as_tuples`."""
    nlp, vector_layer = hooked
    docs = list(nlp.pipe(TEXTS, n_process=2, batch_size=1))
    assert_tensor_vectors(docs, vector_layer)
    assert_elmo_vectors([set_vector_hooks(doc) for doc in docs], vector_layer)
    pairs = list(nlp.pipe([(t, i) for i, t in enumerate(TEXTS)], as_tuples=True, n_process=2))
    assert [context for _, context in pairs] == [0, 1]
    assert_tensor_vectors([doc for doc, _ in pairs], vector_layer)


@pytest.mark.filterwarnings("ignore:.*W109")
def test_docs_from_a_docbin_get_elmo_vectors_back_from_set_vector_hooks(hooked):
    """A DocBin keeps the layers and the rule (`store_user_data=True`), not the hooks nor the
    tensor: `set_vector_hooks(doc)`, or the first read of an ELMo extension, puts them back."""
    nlp, vector_layer = hooked
    docbin = DocBin(store_user_data=True, docs=[nlp(text) for text in TEXTS])
    docs = list(DocBin().from_bytes(docbin.to_bytes()).get_docs(nlp.vocab))
    assert not any(doc.user_token_hooks for doc in docs)
    assert_elmo_vectors([set_vector_hooks(doc) for doc in docs], vector_layer)
    again = list(DocBin().from_bytes(docbin.to_bytes()).get_docs(nlp.vocab))
    assert again[0]._.elmo_layers is not None and again[1]._.elmo is not None
    assert all("vector" in doc.user_token_hooks for doc in again)
    # docs without a vector rule are left to spaCy
    no_rule = nlp(TEXTS[0])
    no_rule._.elmo_vector_layer = None
    no_rule.user_token_hooks.clear()
    (doc,) = DocBin(store_user_data=True, docs=[no_rule]).get_docs(nlp.vocab)
    assert doc._.elmo_layers is not None and not doc.user_token_hooks


def test_set_tensor_and_other_vectors_are_refused_together(bilm_dir):
    with pytest.raises(ValueError, match="set_tensor writes the mix into doc.tensor"):
        tiny_nlp(bilm_dir, vector_hooks=True, set_tensor=True, vector_layer="top")
    nlp = tiny_nlp(bilm_dir, vector_hooks=True, set_tensor=True, vector_layer="mix")
    nlp.initialize()
    doc = nlp(TEXTS[0])
    np.testing.assert_allclose(doc.tensor, doc._.elmo, atol=1e-6)


@pytest.mark.filterwarnings("ignore:.*W109")
def test_a_doc_from_bytes_gets_its_hooks_back_at_its_first_elmo_read(hooked):
    nlp, vector_layer = hooked
    docs = [Doc(nlp.vocab).from_bytes(nlp(text).to_bytes()) for text in TEXTS]
    assert all(not doc.user_token_hooks for doc in docs)
    assert_tensor_vectors(docs, vector_layer)  # Doc.to_bytes keeps the tensor
    assert docs[0][2]._.elmo_layers is not None  # any read of an extension of the doc
    assert docs[1][0:2]._.elmo is not None
    assert all("vector" in doc.user_token_hooks for doc in docs)
    assert_elmo_vectors(docs, vector_layer)


FRESH_PROCESS = r"""
import sys, warnings
import spacy
from spacy.tokens import DocBin
from spacy_elmo.pipeline.extensions import set_vector_hooks

warnings.simplefilter("ignore")  # W109 from the workers' Doc.to_bytes
nlp = spacy.load(sys.argv[1])  # resolves the elmo factory by its entry point
docs = list(nlp.pipe(["the river bank", "the investment bank"], n_process=2, batch_size=1))
print(docs[0][2].vector @ docs[1][2].vector)  # doc.tensor's vectors, as spaCy serves them
data = DocBin(store_user_data=True, docs=docs).to_bytes()
back = list(DocBin().from_bytes(data).get_docs(nlp.vocab))
for river, money in (docs, back):
    set_vector_hooks(river), set_vector_hooks(money)
    print(river[2].similarity(money[2]), river._.elmo_layers[-1, 2] @ money._.elmo_layers[-1, 2])
"""


def run_on_saved_hooked_pipeline(script: str, bilm_dir, tmp_path):
    """A pipeline with vector hooks, saved, and `script` run on it in a fresh Python process
    (its path the one argument): the pipeline and the finished process, checked to exit 0."""
    nlp = tiny_nlp(bilm_dir, vector_hooks=True)
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pipeline")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return nlp, run


@pytest.mark.slow
def test_a_loaded_pipeline_gives_elmo_similarity_after_n_process_and_docbin(bilm_dir, tmp_path):
    """What a user writes, in a fresh process: `spacy.load`, `nlp.pipe(n_process=2)`, a
    DocBin, `set_vector_hooks`; "bank" against "bank" is ELMo's cosine (top layer), not
    spaCy's 1.0, and the vectors spaCy serves from `doc.tensor` are the top layer's."""
    nlp, run = run_on_saved_hooked_pipeline(FRESH_PROCESS, bilm_dir, tmp_path)
    river, money = nlp("the river bank"), nlp("the investment bank")
    a, b = river._.elmo_layers[-1, 2], money._.elmo_layers[-1, 2]
    expected = cosine(a.astype(np.float64), b.astype(np.float64))
    lines = run.stdout.splitlines()
    assert len(lines) == 3, run.stdout
    assert float(lines[0]) == pytest.approx(float(a @ b), rel=1e-4)
    for line in lines[1:]:
        similarity, dot = map(float, line.split())
        assert similarity == pytest.approx(expected, rel=1e-5) and similarity < 0.9999
        assert dot == pytest.approx(float(a @ b), rel=1e-4)
