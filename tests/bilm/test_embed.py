"""`BiLM.embed`: determinism across batching, odd inputs, and the torch forward/backward."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from spacy_elmo import BiLM, batch_to_ids
from spacy_elmo.bilm import model

from .numpy_reference import NumpyBiLM
from .util import tiny_options, write_random_model

WORDS = "the a bank river money flood rain loan water account , . ! ? ELMo spaCy".split()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("model"), tiny_options(), seed=5)


@pytest.fixture(scope="module")
def bilm(files):
    return BiLM.from_allennlp(*files)


def random_sentences(n, seed=0):
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(0, 25))] for _ in range(n)]


def test_default_mode_is_batch_invariant(bilm):
    sentences = random_sentences(30)
    alone = [bilm.embed([s])[0] for s in sentences]
    for batch_size in (3, 7, 30):
        for got, ref in zip(bilm.embed(sentences, batch_size=batch_size), alone):
            np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    order = list(range(30))
    random.Random(1).shuffle(order)
    shuffled = bilm.embed([sentences[i] for i in order], batch_size=8)
    for position, index in enumerate(order):
        np.testing.assert_allclose(shuffled[position], alone[index], atol=1e-5, rtol=0)
    # Same call twice: identical, no hidden state.
    for a, b in zip(bilm.embed(sentences), bilm.embed(sentences)):
        np.testing.assert_array_equal(a, b)


def test_neighbours_do_not_matter(bilm):
    target = ["the", "river", "bank", "flood"]
    reference = bilm.embed([target])[0]
    for neighbours in (random_sentences(5, seed=2), [["x"] * 60], [[]]):
        got = bilm.embed([*neighbours, target], batch_size=16)[-1]
        np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)


def test_empty_inputs(bilm):
    assert bilm.embed([]) == []
    (empty,) = bilm.embed([[]])
    assert empty.shape == (3, 0, 16) and empty.dtype == np.float32
    assert [x.shape for x in bilm.embed([[], [], []])] == [(3, 0, 16)] * 3


def test_unusual_tokens_follow_the_spec(bilm, files):
    reference = NumpyBiLM(*files)
    sentences = [
        ["x" * 1000, "北京欢迎你" * 30, "😀🎉", " ", "\n", "\x07bell", "<S>", "</S>", ""],
        ["混合", "text", "ünïcödé", "\u200b"],
    ]
    for tokens, got in zip(sentences, bilm.embed(sentences)):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, reference.sentence(tokens)[0], atol=1e-5, rtol=0)


def test_type_errors(bilm):
    with pytest.raises(TypeError, match="token 2 of sentence 0"):
        bilm.embed([["a", "b", 7]])
    with pytest.raises(TypeError, match="sentence 0 must be a list"):
        bilm.embed(["not tokenised"])
    with pytest.raises(ValueError, match="batch_size"):
        bilm.embed([["a"]], batch_size=0)


def test_torch_forward_shapes_and_mask(bilm):
    output = bilm(batch_to_ids([["a", "b", "c"], ["d"]]))
    assert output.layers.shape == (3, 2, 3, 16)
    assert output.mask.tolist() == [[True, True, True], [True, False, False]]
    assert output.layers[:, 1, 1:].abs().max() == 0
    with pytest.raises(ValueError, match="shape"):
        bilm(torch.zeros(2, 3, dtype=torch.long))
    gap = batch_to_ids([["a", "b", "c"]])
    gap[0, 1] = 0
    with pytest.raises(ValueError, match="padding"):
        bilm(gap)


def test_gradients_match_finite_differences(files):
    """Backward through the packed LSTM, clipping and the char CNN, in float64."""
    bilm = BiLM.from_allennlp(*files).double()
    ids = batch_to_ids([["a", "bank"], ["river"]])
    weight = torch.randn(3, 2, 2, 16, dtype=torch.float64)
    params = [
        bilm.forward_lstm.layers[1].recurrent_weight,
        bilm.backward_lstm.layers[0].input_weight,
        bilm.char_cnn.highways[0].weight,
        bilm.char_cnn.convolutions[1].bias,
    ]
    for param in params:
        loss = (bilm(ids).layers * weight).sum()
        (grad,) = torch.autograd.grad(loss, param)
        for flat_index in torch.randperm(param.numel(), generator=torch.Generator().manual_seed(0))[
            :4
        ]:
            index = np.unravel_index(int(flat_index), param.shape)
            with torch.no_grad():
                original = param[index].item()
                param[index] = original + 1e-6
                up = (bilm(ids).layers * weight).sum().item()
                param[index] = original - 1e-6
                down = (bilm(ids).layers * weight).sum().item()
                param[index] = original
            assert abs((up - down) / 2e-6 - grad[index].item()) < 1e-5 * max(
                1, abs(grad[index].item())
            )


def test_token_cache_is_exact_and_follows_weight_changes(files, tmp_path, monkeypatch):
    monkeypatch.setattr(model, "FAST_PATHS", True)  # the token cache is the engine's
    cached = BiLM.from_allennlp(*files)
    uncached = BiLM.from_allennlp(*files)
    uncached.token_cache_size = 0
    sentences = random_sentences(20, seed=3)
    for _ in range(2):  # the second pass reads every token vector from the cache
        for a, b in zip(cached.embed(sentences), uncached.embed(sentences)):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert 0 < len(cached.token_cache.rows) <= len(WORDS) + 2  # words, <S> and </S>
    other_files = write_random_model(tmp_path, tiny_options(), seed=9)
    other = BiLM.from_allennlp(*other_files)
    cached.load_state_dict(other.state_dict())  # new weights: the cache must not be used
    for a, b in zip(cached.embed(sentences), other.embed(sentences)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    with torch.no_grad():
        cached.char_cnn.projection.bias.add_(1.0)  # in-place change, same tensor
    uncached.load_state_dict(cached.state_dict())
    for a, b in zip(cached.embed(sentences), uncached.embed(sentences)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    cached.token_cache_size = 3
    cached.embed(sentences)
    assert len(cached.token_cache.rows) == 3
