"""The one-file reference biLM (`bilm/reference.py`) against the TensorFlow fixture and NumPy,
and every route of `BiLM` (the default fast one, the reference one) against the reference."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from spacy_elmo import BiLM, batch_to_ids
from spacy_elmo.bilm.reference import ReferenceBiLM

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
    from spacy_elmo.bilm import fast_paths

    monkeypatch.setattr(fast_paths, "ENABLED", route == "fast")
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
