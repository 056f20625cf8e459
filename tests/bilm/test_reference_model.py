"""The one-file reference biLM (`bilm/reference.py`) against the TensorFlow fixture and NumPy,
and every route of `BiLM` (the default fast one, the reference one) against the reference."""

from __future__ import annotations

import ast
import sys

import h5py
import numpy as np
import pytest
import torch

from spacy_elmo import BiLM, batch_to_ids
from spacy_elmo.bilm import reference as reference_module
from spacy_elmo.bilm.reference import ReferenceBiLM
from spacy_elmo.description import chars

from .numpy_reference import NumpyBiLM
from .test_reference import SENTENCES, VARIANTS
from .util import (
    fixture_bilm,
    fixture_sentences,
    fixture_top_layer,
    tiny_options,
    write_random_model,
)

FIXTURE_TOLERANCE = 1e-5  # against TensorFlow's float32 numbers, as tests/bilm/test_fixture.py
# A route against the reference: float rounding only. On the fixture's weights to 1e-6; the
# random models' larger weights and values (up to the clips, 3) round to a few 1e-6.
FIXTURE_ROUTE_TOLERANCE = 1e-6
ROUTE_TOLERANCE = 1e-5


def test_the_reference_imports_torch_and_the_standard_library_only():
    tree = ast.parse(open(reference_module.__file__, encoding="utf-8").read())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = set()
    for node in imports:
        assert not (isinstance(node, ast.ImportFrom) and node.level), "a package import"
        if isinstance(node, ast.ImportFrom):
            modules = [node.module]
        else:
            modules = [alias.name for alias in node.names]
        names |= {module.split(".")[0] for module in modules}
    assert names - set(sys.stdlib_module_names) == {"torch"}


WORDS = ["a", "river", "<S>", "</S>", "", " ", "x" * 60, "🙂", "银行", "e\u0301", "ß" * 30]


def test_the_reference_char_ids_are_the_packages():
    """The reference's own §4 (a token at a time) and the package's (`description/chars.py`,
    a batch at a time): the same ids, boundaries included."""
    for word in WORDS:
        assert tuple(reference_module.token_ids(word)) == chars.token_to_char_ids(word), word
    assert (reference_module.BOS_IDS, reference_module.EOS_IDS) == (
        chars.BOS_CHAR_IDS,
        chars.EOS_CHAR_IDS,
    )
    ids = chars.batch_to_ids([WORDS, WORDS[3:5], []])
    ours = reference_module.add_boundaries(ids, reference_module.BOS_IDS, reference_module.EOS_IDS)
    theirs = chars.add_boundaries(ids, chars.BOS_CHAR_IDS, chars.EOS_CHAR_IDS)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1] + 2)
    rows = [reference_module.token_ids(word) for word in WORDS]
    assert torch.equal(ids[0], torch.tensor(rows))


def test_the_reference_reproduces_tensorflow_with_carried_states(allennlp_fixture):
    reference = ReferenceBiLM.of(fixture_bilm(allennlp_fixture))
    sentences = fixture_sentences(allennlp_fixture)
    states = None
    with torch.no_grad():
        for i in range(10):
            batch = [sentences[k][i] for k in range(3)]
            layers, states = reference(batch_to_ids(batch), states)
            for k, tokens in enumerate(batch):
                got = layers[2, k, : len(tokens)].numpy()
                np.testing.assert_allclose(
                    got, fixture_top_layer(allennlp_fixture, k, i), atol=FIXTURE_TOLERANCE, rtol=0
                )


def test_the_reference_char_cnn_reproduces_tensorflow(allennlp_fixture):
    vocab = (allennlp_fixture / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    with h5py.File(allennlp_fixture / "elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][...]
    reference = ReferenceBiLM.of(fixture_bilm(allennlp_fixture))
    with torch.no_grad():
        vectors = reference.char_cnn(batch_to_ids([vocab])[0]).numpy()
    np.testing.assert_allclose(vectors, expected, atol=FIXTURE_TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_reference_matches_numpy(tmp_path, name):
    options_file, weight_file = write_random_model(tmp_path, VARIANTS[name], seed=1)
    numpy_bilm = NumpyBiLM(options_file, weight_file)
    reference = ReferenceBiLM.of(BiLM.from_allennlp(options_file, weight_file))
    with torch.no_grad():
        layers, _ = reference(batch_to_ids(SENTENCES))
    for row, tokens in enumerate(SENTENCES):
        expected, _, _ = numpy_bilm.sentence(tokens)
        np.testing.assert_allclose(
            layers[:, row, : len(tokens)].numpy(), expected, atol=1e-5, rtol=0
        )


def test_reference_gradients_match_finite_differences(tmp_path):
    options_file, weight_file = write_random_model(tmp_path, tiny_options(), seed=3, scale=0.3)
    reference = ReferenceBiLM.of(BiLM.from_allennlp(options_file, weight_file)).double()
    ids = batch_to_ids([["a", "bc"], ["d"]])
    names = ("forward_lstm.layers.1.recurrent_weight", "backward_lstm.layers.0.projection_weight")

    def top(*weights):
        return torch.func.functional_call(reference, dict(zip(names, weights)), (ids,))[0][-1]

    parameters = dict(reference.named_parameters())
    inputs = tuple(parameters[name].detach().clone().requires_grad_() for name in names)
    assert torch.autograd.gradcheck(top, inputs, eps=1e-6, atol=1e-5, fast_mode=True)


# ---------------------------------------------------------------------- the routes of BiLM
def route_bilm(monkeypatch, route: str, options_file, weight_file, **kwargs) -> BiLM:
    """A BiLM loaded on one route: "fast" (the default) or "reference" (every fast path off:
    the reference's forward pass inside `BiLM`, with its states and ids)."""
    from spacy_elmo.bilm import model

    monkeypatch.setattr(model, "FAST_PATHS", route == "fast")
    return BiLM.from_allennlp(options_file, weight_file, **kwargs)


ROUTES = ("fast", "reference")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_route_at_inference_equals_the_reference(monkeypatch, tmp_path, route, name):
    files = write_random_model(tmp_path, VARIANTS[name], seed=1)
    bilm = route_bilm(monkeypatch, route, *files)
    reference = ReferenceBiLM.of(bilm)
    ids = batch_to_ids(SENTENCES)
    with torch.inference_mode():
        expected, _ = reference(ids)
        for _ in range(2):  # the second time through the token cache
            torch.testing.assert_close(bilm(ids).layers, expected, atol=ROUTE_TOLERANCE, rtol=0)


@pytest.mark.parametrize("route", ROUTES)
def test_each_route_on_the_fixture_equals_the_reference(monkeypatch, allennlp_fixture, route):
    files = (allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5")
    bilm = route_bilm(monkeypatch, route, *files, stateful=True)
    reference = ReferenceBiLM.of(bilm)
    sentences = fixture_sentences(allennlp_fixture)
    states = None
    with torch.inference_mode():
        for i in range(4):
            ids = batch_to_ids([sentences[k][i] for k in range(3)])
            expected, states = reference(ids, states)
            got = bilm(ids).layers
            torch.testing.assert_close(got, expected, atol=FIXTURE_ROUTE_TOLERANCE, rtol=0)


@pytest.mark.parametrize("route", ROUTES)
def test_each_route_with_autograd_equals_the_reference(monkeypatch, tmp_path, route):
    """Training (the fused LSTM cells on the fast route): the layers and every gradient."""
    files = write_random_model(tmp_path, tiny_options(), seed=4)
    bilm = route_bilm(monkeypatch, route, *files)
    reference = ReferenceBiLM.of(bilm)
    ids = batch_to_ids(SENTENCES)
    weights = torch.linspace(-1, 1, steps=bilm(ids).layers.numel()).reshape(bilm(ids).layers.shape)
    results = []
    for model, layers in ((bilm, lambda: bilm(ids).layers), (reference, lambda: reference(ids)[0])):
        model.zero_grad()
        output = layers()
        (output * weights).sum().backward()
        gradients = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        results.append((output.detach(), gradients))
    (got, got_gradients), (expected, expected_gradients) = results
    torch.testing.assert_close(got, expected, atol=ROUTE_TOLERANCE, rtol=0)
    assert got_gradients.keys() == expected_gradients.keys()
    for name, gradient in got_gradients.items():
        # float32 sums over every position: the rounding of a few 1e-6 adds up
        torch.testing.assert_close(gradient, expected_gradients[name], atol=1e-4, rtol=1e-4)
