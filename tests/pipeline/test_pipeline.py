"""The `elmo` component: extensions, units, odd input, serialisation, multiprocessing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import spacy
import torch
from spacy.tokens import Doc, DocBin

from spacy_elmo import BiLM
from spacy_elmo.layers.elmo_model import get_bilm

from .pipeline_util import TINY_WIDTH, tiny_nlp


@pytest.fixture(scope="module")
def bilm(bilm_dir):
    return BiLM.load(bilm_dir)


@pytest.fixture(scope="module")
def nlp(bilm_dir):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    return nlp


def test_factory_resolves_without_importing_spacy_elmo():
    code = (
        "import sys, spacy; nlp = spacy.blank('en'); nlp.add_pipe('elmo'); "
        "print('spacy_elmo' in sys.modules, nlp.pipe_names)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True ['elmo']"


def test_layers_equal_the_bilm_on_the_docs_tokens(nlp, bilm):
    doc = nlp("The river bank overflowed after heavy rain")
    assert doc._.elmo_layers.shape == (3, 7, TINY_WIDTH)
    assert doc._.elmo_layers.dtype == np.float32
    expected = bilm.embed([[t.text for t in doc]])[0]
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)
    token = doc[2]
    assert token._.elmo_layers.shape == (3, TINY_WIDTH)
    assert np.shares_memory(token._.elmo_layers, doc._.elmo_layers)  # a view, no copy
    span = doc[1:3]
    assert span._.elmo_layers.shape == (3, 2, TINY_WIDTH)
    assert np.shares_memory(span._.elmo_layers, doc._.elmo_layers)
    # Default mix: equal weights, gamma 1.
    np.testing.assert_allclose(doc._.elmo, expected.mean(0), atol=1e-5)
    np.testing.assert_allclose(token._.elmo, expected[:, 2].mean(0), atol=1e-5)
    np.testing.assert_allclose(span._.elmo, expected[:, 1:3].mean(0), atol=1e-5)


def test_configured_mix(bilm_dir, bilm):
    nlp = tiny_nlp(bilm_dir, mix_weights=[0.0, 1.0, 3.0], gamma=2.0)
    nlp.initialize()
    doc = nlp("river bank")
    layers = bilm.embed([["river", "bank"]])[0]
    np.testing.assert_allclose(doc._.elmo, 2.0 * (0.25 * layers[1] + 0.75 * layers[2]), atol=1e-5)
    # c = gamma * s, s = mix_weights / their sum.
    assert doc._.elmo_mix_coefficients == pytest.approx([0.0, 0.5, 1.5])
    with pytest.raises(ValueError, match="mix_weights has 2 values"):
        tiny_nlp(bilm_dir, mix_weights=[1.0, 1.0])


def test_layers_and_coefficients_are_what_a_saved_doc_keeps(nlp, bilm):
    """Only `elmo_layers`, `elmo_mix_coefficients` and the character offsets of the tokens the
    layers are for are stored on the doc; the mixes and the span and token views of a doc read
    back from bytes are computed from them."""
    doc = nlp("river bank")
    # the layers under keys of spacy-elmo's own in `doc.user_data` (spaCy's store of user
    # data), the coefficients as an extension's value
    assert sorted(map(str, doc.user_data)) == [
        "('._.', 'elmo_mix_coefficients', None, None)",
        "spacy_elmo.layers",
        "spacy_elmo.token_offsets",
    ]
    np.testing.assert_array_equal(doc.user_data["spacy_elmo.token_offsets"], [[0, 5], [6, 10]])
    assert doc._.elmo_mix_coefficients == pytest.approx([1 / 3] * 3)
    doc._.elmo_mix_coefficients = [0.0, 0.0, 2.0]
    restored = Doc(nlp.vocab).from_bytes(doc.to_bytes())
    assert restored._.elmo_mix_coefficients == [0.0, 0.0, 2.0]
    layers = bilm.embed([["river", "bank"]])[0]
    np.testing.assert_allclose(restored._.elmo, 2.0 * layers[2], atol=1e-5)
    np.testing.assert_allclose(restored[1]._.elmo, 2.0 * layers[2, 1], atol=1e-5)
    restored._.elmo_mix_coefficients = [1.0, 0.0, 0.0]
    np.testing.assert_allclose(restored[0:1]._.elmo, layers[0, 0:1], atol=1e-5)
    assert not Doc.has_extension("elmo_mix_weights")


def test_setting_layers_by_hand_is_checked_against_the_doc(nlp):
    """doc._.elmo_layers must be (n_layers, len(doc), D), float32 or float16; the error names
    the expected and the given shape."""
    blank = nlp.make_doc("the river bank")
    blank._.elmo_layers = np.zeros((2, 3, 5), dtype=np.float16)  # no coefficients: any depth
    assert blank._.elmo_layers.shape == (2, 3, 5)
    doc = nlp("the river bank")  # 3 tokens, 3 layers (its 3 mix coefficients)
    layers = doc._.elmo_layers
    with pytest.raises(ValueError, match=r"shape \(3, 3, D\) .*got \(3, 4, 16\)"):
        doc._.elmo_layers = np.zeros((3, 4, 16), dtype=np.float32)
    with pytest.raises(ValueError, match=r"got \(2, 3, 16\); the doc has 3 mix coefficients"):
        doc._.elmo_layers = np.zeros((2, 3, 16), dtype=np.float32)
    with pytest.raises(ValueError, match=r"got \(3, 16\)"):
        doc._.elmo_layers = np.zeros((3, 16), dtype=np.float32)
    with pytest.raises(TypeError, match="float32 or float16, got float64"):
        doc._.elmo_layers = np.zeros((3, 3, 16))
    with pytest.raises(TypeError, match="numpy or cupy array of shape \\(3, 3, D\\), got list"):
        doc._.elmo_layers = [[[0.0]]]
    assert doc._.elmo_layers is layers  # nothing changed
    doc._.elmo_layers = layers * 2  # a right one is kept, and read back from bytes
    restored = Doc(nlp.vocab).from_bytes(doc.to_bytes())
    np.testing.assert_array_equal(restored._.elmo_layers, layers * 2)
    doc._.elmo_layers = None


def test_sentences_are_the_units(bilm_dir, bilm):
    nlp = tiny_nlp(bilm_dir, pipeline=("elmo", "sentencizer"))
    nlp.remove_pipe("sentencizer")
    nlp.add_pipe("sentencizer", first=True)
    nlp.initialize()
    doc = nlp("The river rose. The bank closed!")
    sents = [[t.text for t in s] for s in doc.sents]
    assert len(sents) == 2
    expected = np.concatenate(bilm.embed(sents), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)


def test_whitespace_tokens_are_skipped_and_zero(nlp, bilm):
    doc = nlp("river  bank \n flooded")
    texts = [t.text for t in doc]
    spaces = [i for i, t in enumerate(doc) if t.is_space]
    assert spaces, texts
    assert not doc._.elmo_layers[:, spaces].any()
    words = [t.text for t in doc if not t.is_space]
    kept = [i for i, t in enumerate(doc) if not t.is_space]
    np.testing.assert_allclose(doc._.elmo_layers[:, kept], bilm.embed([words])[0], atol=1e-5)


def test_long_docs_without_sentences_are_windowed(bilm_dir, bilm):
    nlp = tiny_nlp(bilm_dir, model={"max_tokens": 4, "batch_tokens": 12})
    nlp.initialize()
    words = [f"w{i}" for i in range(10)]
    doc = nlp(Doc(nlp.vocab, words=words))
    expected = np.concatenate(bilm.embed([words[0:4], words[4:8], words[8:10]]), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "\n\n", "x" * 1000, "😀 🎉 emoji", "北京欢迎你 東京", "mixed 中文 and ünïcödé"],
)
def test_odd_input_works(nlp, bilm, text):
    doc = nlp(text)
    assert doc._.elmo_layers.shape == (3, len(doc), TINY_WIDTH)
    assert np.isfinite(doc._.elmo_layers).all()
    words = [t.text for t in doc if not t.is_space]
    if words:
        kept = [i for i, t in enumerate(doc) if not t.is_space]
        np.testing.assert_allclose(doc._.elmo_layers[:, kept], bilm.embed([words])[0], atol=1e-5)


def test_float16_storage(bilm_dir, nlp):
    half = tiny_nlp(bilm_dir, model={"store_dtype": "float16"})
    half.initialize()
    doc16, doc32 = half("river bank flooded"), nlp("river bank flooded")
    assert doc16._.elmo_layers.dtype == np.float16
    np.testing.assert_allclose(doc16._.elmo_layers, doc32._.elmo_layers, atol=2e-3, rtol=2e-3)
    assert doc16._.elmo.dtype == np.float32


@pytest.mark.filterwarnings("ignore:.*W007")
def test_set_tensor_gives_token_vectors_and_similarity(bilm_dir):
    nlp = tiny_nlp(bilm_dir, set_tensor=True)
    nlp.initialize()
    doc = nlp("The river bank")
    np.testing.assert_allclose(doc.tensor, doc._.elmo, atol=1e-5)
    np.testing.assert_allclose(doc[2].vector, doc[2]._.elmo, atol=1e-5)
    other = nlp("An investment bank")
    a, b = doc._.elmo.mean(0), other._.elmo.mean(0)
    cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert doc.similarity(other) == pytest.approx(cosine, abs=1e-5)
    assert cosine < 1.0 - 1e-6


def test_doc_to_bytes_and_docbin_keep_the_layers(nlp):
    docs = list(nlp.pipe(["river bank", "investment bank approved", ""]))
    for doc in docs:
        restored = Doc(nlp.vocab).from_bytes(doc.to_bytes())
        np.testing.assert_array_equal(restored._.elmo_layers, doc._.elmo_layers)
        np.testing.assert_allclose(restored._.elmo, doc._.elmo)
    docbin = DocBin(store_user_data=True, docs=docs)
    restored = list(DocBin().from_bytes(docbin.to_bytes()).get_docs(nlp.vocab))
    for a, b in zip(docs, restored):
        np.testing.assert_array_equal(a._.elmo_layers, b._.elmo_layers)


def test_pipe_with_two_processes(nlp):
    texts = ["river bank", "the investment bank approved it", "", "x " * 30]
    single = list(nlp.pipe(texts))
    multi = list(nlp.pipe(texts, n_process=2, batch_size=1))
    for a, b in zip(single, multi):
        np.testing.assert_allclose(a._.elmo_layers, b._.elmo_layers, atol=1e-5)


def test_a_forked_child_runs_the_bilm_on_one_thread(nlp):
    """The parent's OpenMP pool does not survive `fork` (a multi-threaded product in the child
    would wait for it forever): a forked child's biLM runs on one thread
    (`util.threads.thread_count`), with the parent's layers, and ends."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    text = "the investment bank approved it"
    expected = nlp.get_pipe("elmo").predict([nlp.make_doc(text)])[0]  # the pool started
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: run the component, report, run nothing else of pytest's
            try:
                layers = nlp(text)._.elmo_layers
                same = np.allclose(layers, expected, atol=1e-5, rtol=0)
                os.write(write, f"{torch.get_num_threads()} {same}".encode())
            finally:
                os._exit(0)
        os.close(write)
        deadline = time.monotonic() + 120
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child's biLM did not finish in 120 s")
            time.sleep(0.05)
        assert os.read(read, 32) == b"1 True"
    finally:
        torch.set_num_threads(threads)
        os.close(read)


def assert_same_weights(a, b):
    """Bit-identical biLM weights (outputs may differ by float rounding: the token cache of a
    used model holds vectors computed in other batches)."""
    state_a, state_b = get_bilm(a).state_dict(), get_bilm(b).state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


def test_to_disk_and_load_need_only_the_directory(nlp, tmp_path):
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    assert loaded.get_pipe("elmo").model.attrs["weights_loaded"]
    assert_same_weights(nlp.get_pipe("elmo").model, loaded.get_pipe("elmo").model)
    a, b = nlp("the river bank"), loaded("the river bank")
    np.testing.assert_allclose(a._.elmo_layers, b._.elmo_layers, atol=1e-6, rtol=0)
    restored = spacy.blank("en").from_config(nlp.config)
    restored.from_bytes(nlp.to_bytes())
    assert_same_weights(nlp.get_pipe("elmo").model, restored.get_pipe("elmo").model)
    np.testing.assert_allclose(
        restored("the river bank")._.elmo_layers, a._.elmo_layers, atol=1e-6, rtol=0
    )


def test_settings_given_at_load_win_over_the_saved_ones(nlp, bilm, tmp_path):
    """The saved model carries no run settings: those of the config given at load hold
    (here: windows of 4 tokens, float16)."""
    nlp.to_disk(tmp_path / "pipeline")
    override = {"max_tokens": 4, "batch_tokens": 12, "store_dtype": "float16"}
    loaded = spacy.load(tmp_path / "pipeline", config={"components": {"elmo": {"model": override}}})
    model = loaded.get_pipe("elmo").model
    settings = model.attrs["settings"]
    assert {key: getattr(settings, key) for key in override} == override
    words = [f"w{i}" for i in range(10)]
    doc = loaded(Doc(loaded.vocab, words=words))
    assert doc._.elmo_layers.dtype == np.float16
    expected = np.concatenate(bilm.embed([words[0:4], words[4:8], words[8:10]]), axis=1)
    np.testing.assert_allclose(doc._.elmo_layers, expected, atol=2e-2, rtol=1e-2)


def test_thinc_model_bytes_round_trip(nlp, bilm_dir):
    model = nlp.get_pipe("elmo").model
    fresh = tiny_nlp(bilm_dir).get_pipe("elmo").model  # random weights, not loaded
    fresh.from_bytes(model.to_bytes())
    assert_same_weights(model, fresh)
    assert fresh.attrs["weights_loaded"]
    docs = [nlp.make_doc("the river bank flooded")]
    np.testing.assert_allclose(model.predict(docs)[0], fresh.predict(docs)[0], atol=1e-6, rtol=0)


def test_mismatched_weights_fail_at_initialize(tmp_path, bilm_dir):
    nlp = tiny_nlp(bilm_dir, model={"lstm_dim": 32})
    with pytest.raises(ValueError, match="do not match the elmo model's configuration: .*lstm.dim"):
        nlp.initialize()


def test_missing_weights_file_fails_at_initialize(tmp_path, bilm_dir):
    nlp = tiny_nlp(bilm_dir)
    nlp.config["initialize"]["components"]["elmo"]["weights"]["path"] = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="biLM .*nope does not exist"):
        nlp.initialize()


def test_allennlp_weights_loader(allennlp_fixture):
    nlp = spacy.blank("en")
    nlp.add_pipe(
        "elmo",
        config={
            "model": {
                "char_embedding_dim": 4,
                "filters": [[1, 4], [2, 8], [3, 16], [4, 32], [5, 64]],
                "n_highway": 2,
                "lstm_dim": 64,
                "projection_dim": 16,
            }
        },
    )
    nlp.config["initialize"]["components"]["elmo"] = {
        "weights": {
            "@misc": "spacy_elmo.AllenNLPWeights.v1",
            "options_file": str(allennlp_fixture / "options.json"),
            "weights_file": str(allennlp_fixture / "lm_weights.hdf5"),
        }
    }
    nlp.initialize()
    doc = nlp(Doc(nlp.vocab, words=["Don", "'t", "!"]))
    reference = BiLM.from_allennlp(
        allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5"
    )
    np.testing.assert_allclose(
        doc._.elmo_layers, reference.embed([["Don", "'t", "!"]])[0], atol=1e-5
    )
