"""int8 inference (`bilm/quantize.py`): the product against a NumPy model of the scheme, the
biLM's error against float32 on the AllenNLP fixture, the clips, switching and copying."""

from __future__ import annotations

import copy
import json
import pickle
import warnings

import numpy as np
import pytest
import torch

from spacy_elmo import BiLM, batch_to_ids
from spacy_elmo.bilm.quantize import (
    Int8Weight,
    check_quantize,
    linear_int8,
    quantize_int8,
    quantize_mode,
    set_quantize,
)

# Measured on the fixture (30 sentences, zero state; torch 2.13 CPU): relative error
# ||int8 - float32|| / ||float32|| of layers 0 / 1 / 2 = 0.0046 / 0.0054 / 0.0040, max abs
# error 0.030 / 0.030 / 0.029 (outputs up to 7.1 / 3.0 / 4.6). The bounds leave 2x of margin.
RELATIVE_BOUND = 0.011
ABSOLUTE_BOUND = 0.06


def load(fixture, **kwargs) -> BiLM:
    return BiLM.from_allennlp(fixture / "options.json", fixture / "lm_weights.hdf5", **kwargs)


@pytest.fixture(scope="module")
def sentences(allennlp_fixture):
    with open(allennlp_fixture / "sentences.json") as f:
        return [s.split() for batch in json.load(f) for s in batch]


def reference_int8_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The scheme of the module docstring in float64: every row of x and of the weight in
    -127..127 with its own scale, max |row| / 127."""

    def rows(a):
        scale = np.maximum(np.abs(a).max(axis=1, keepdims=True), 1e-12) / 127
        return np.round(a / scale), scale

    x_q, x_scale = rows(x.astype(np.float64))
    weight_q, weight_scale = rows(weight.astype(np.float64))
    return (x_q @ weight_q.T) * x_scale * weight_scale.T + bias


@pytest.mark.parametrize("rows,out,inn", [(1, 64, 16), (7, 256, 16), (33, 248, 124)])
def test_int8_product_matches_the_numpy_model_of_the_scheme(rows, out, inn):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, inn, generator=generator) * 2 + 0.3
    weight = torch.randn(out, inn, generator=generator)
    bias = torch.randn(out, generator=generator)
    got = linear_int8(x, Int8Weight(weight, bias)).numpy()
    expected = reference_int8_linear(x.numpy(), weight.numpy(), bias.numpy())
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6 * scale)
    float32 = (x @ weight.T + bias).numpy()
    assert np.abs(got - float32).max() > 1e-3 * scale  # it is int8, not float32


def test_int8_bilm_stays_close_to_float32_on_the_fixture(allennlp_fixture, sentences):
    bilm = load(allennlp_fixture)
    float32 = bilm.embed(sentences)
    assert quantize_int8(bilm) is bilm and quantize_mode(bilm) == "int8"
    int8 = bilm.embed(sentences)
    for layer in range(3):
        diff = np.concatenate([(q[layer] - f[layer]).ravel() for q, f in zip(int8, float32)])
        ref = np.concatenate([f[layer].ravel() for f in float32])
        relative = np.linalg.norm(diff) / np.linalg.norm(ref)
        assert relative < RELATIVE_BOUND, (layer, relative)
        assert np.abs(diff).max() < ABSOLUTE_BOUND, (layer, np.abs(diff).max())
        assert relative > 1e-4, (layer, relative)  # the products did run in int8


def test_int8_outputs_do_not_depend_on_the_batch(allennlp_fixture, sentences):
    """Each input row has its own scale: a sentence alone or in a batch gives the same int8
    vectors (float32 rounding of the rest apart)."""
    bilm = quantize_int8(load(allennlp_fixture))
    bilm.token_cache_size = 0
    some = sentences[::3]  # 10 sentences of 3 to 53 tokens
    batched = bilm.embed(some, batch_size=10)
    for sentence, together in zip(some, batched):
        (alone,) = bilm.embed([sentence])
        np.testing.assert_allclose(alone, together, rtol=0, atol=2e-6)


def test_switching_back_to_float32_is_exact(allennlp_fixture, sentences):
    bilm = load(allennlp_fixture)
    float32 = bilm.embed(sentences[:6])
    quantize_int8(bilm)
    bilm.embed(sentences[:6])  # fills the token cache with int8 vectors
    set_quantize(bilm, "none")
    assert quantize_mode(bilm) is None
    for again, before in zip(bilm.embed(sentences[:6]), float32):
        np.testing.assert_array_equal(again, before)


def test_projection_clip_holds_in_int8(allennlp_fixture, sentences):
    """The first LSTM layer's output is the clipped projection (no residual): never above
    proj_clip, and with a small clip the bound is reached exactly."""
    bilm = quantize_int8(load(allennlp_fixture))
    top = max(np.abs(e[1]).max() for e in bilm.embed(sentences))
    assert top <= bilm.options.proj_clip
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        for cell in stack.layers:
            cell.proj_clip = 0.25
    layer_one = np.concatenate([e[1].ravel() for e in bilm.embed(sentences)])
    assert np.abs(layer_one).max() == np.float32(0.25)


def test_cell_clip_holds_in_int8(allennlp_fixture, sentences):
    """The carried cell states are the clipped c_t: never above cell_clip (reached with a
    small clip)."""
    bilm = quantize_int8(load(allennlp_fixture, stateful=True))
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        for cell in stack.layers:
            cell.cell_clip = 0.1
    bilm(batch_to_ids(sentences[:10]))
    cells = [c for states in bilm._carried_states.values() for _, c in states]
    assert max(float(c.abs().max()) for c in cells) == pytest.approx(0.1, abs=1e-7)
    hidden = [h for states in bilm._carried_states.values() for h, _ in states]
    assert max(float(h.abs().max()) for h in hidden) <= bilm.options.proj_clip


def test_new_weights_are_quantised_again(allennlp_fixture, sentences):
    bilm = quantize_int8(load(allennlp_fixture))
    bilm.embed(sentences[:3])  # int8 weights made from the first weights
    torch.manual_seed(0)
    other = BiLM(bilm.options)
    bilm.load_state_dict(other.state_dict())  # in place
    expected = quantize_int8(other).embed(sentences[:3])
    for got, want in zip(bilm.embed(sentences[:3]), expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_stay_int8(allennlp_fixture, sentences, how):
    bilm = quantize_int8(load(allennlp_fixture))
    expected = bilm.embed(sentences[:4])
    if how == "deepcopy":
        copied = copy.deepcopy(bilm)
    else:
        copied = pickle.loads(pickle.dumps(bilm))
    assert quantize_mode(copied) == "int8"
    for got, want in zip(copied.embed(sentences[:4]), expected):
        np.testing.assert_array_equal(got, want)


def test_autograd_runs_in_float32(allennlp_fixture, sentences):
    """Where autograd records (fine-tuning), the products are float32 and differentiable."""
    bilm = load(allennlp_fixture)
    ids = batch_to_ids(sentences[:3])
    with torch.no_grad():
        float32 = bilm(ids).layers
    quantize_int8(bilm)
    layers = bilm(ids).layers
    assert layers.requires_grad
    torch.testing.assert_close(layers.detach(), float32, atol=1e-6, rtol=0)


def test_check_quantize():
    assert check_quantize(None) is None
    assert check_quantize("none") is None
    assert check_quantize("int8") == "int8"
    with pytest.raises(ValueError, match="'none', 'int8'.*got 'int4'"):
        check_quantize("int4")


@pytest.mark.parametrize(
    "capability, warns", [("AVX2", True), ("DEFAULT", True), ("AVX512", False)]
)
def test_int8_warns_once_where_torch_has_no_fast_int8_product(
    allennlp_fixture, monkeypatch, capability, warns
):
    from spacy_elmo.bilm import quantize

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(quantize, "_warned_slow", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a second biLM: no second warning
            quantize.quantize_int8(BiLM.load(allennlp_fixture))
    slow = [w for w in caught if issubclass(w.category, quantize.Int8SpeedWarning)]
    assert len(slow) == (1 if warns else 0)
    if warns:
        assert capability in str(slow[0].message) and "float32" in str(slow[0].message)
