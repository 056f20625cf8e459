"""bfloat16 inference (`bilm/quantize.py`): the products against NumPy model of the
scheme, the biLM's error against float32 on the AllenNLP fixture, the clips, switching and
copying."""

from __future__ import annotations

import copy
import json
import pickle
import warnings

import numpy as np
import pytest
import torch

from spacy_elmo import BiLM, batch_to_ids
from spacy_elmo.bilm.compiled_steps import bf16_product
from spacy_elmo.bilm.lstm import Bf16Layer, layer_kernels
from spacy_elmo.bilm.quantize import (
    Bf16SpeedWarning,
    check_quantize,
    set_quantize,
)
from spacy_elmo.bilm.reference import LstmCell

# bfloat16, measured the same way: layer 0 exact (the char CNN runs in float32), layers 1 / 2
# relative 0.0022 / 0.0019, max abs 0.011 / 0.012. Bounds with 2x of margin.
BF16_RELATIVE_BOUND = 0.0045
BF16_ABSOLUTE_BOUND = 0.025
MODES = ["bf16"]


def load(fixture, **kwargs) -> BiLM:
    return BiLM.from_allennlp(fixture / "options.json", fixture / "lm_weights.hdf5", **kwargs)


def quantized(bilm: BiLM, mode: str) -> BiLM:
    """`bilm` switched to `mode`, without the warning of a CPU that has no fast kernel for it
    (the numbers are the same there, only slower)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Bf16SpeedWarning)
        return set_quantize(bilm, mode)


@pytest.fixture(scope="module")
def sentences(allennlp_fixture):
    with open(allennlp_fixture / "sentences.json") as f:
        return [s.split() for batch in json.load(f) for s in batch]


def to_bfloat16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float64: the top 16 bits of the
    float32 after rounding the lower 16 (finite values)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("rows,out,inn", [(1, 64, 16), (7, 256, 16), (33, 248, 124)])
def test_bf16_products_match_the_numpy_model_of_the_scheme(rows, out, inn):
    """Input, recurrent and projection products of a step: inputs and weights rounded to
    bfloat16, summed exactly (float32 sums in oneDNN), the product rounded to bfloat16, the
    bias and the input gates added in float32. Within one bfloat16 rounding of the product
    (a float32 sum may round to the neighbouring bfloat16), and not the float32 product."""
    generator = torch.Generator().manual_seed(rows)
    cell_dim, hidden = out // 4 * 2, 8

    def weights(*shape):
        return torch.nn.Parameter(torch.randn(*shape, generator=generator) / shape[1] ** 0.5)

    cells = []
    for _ in range(2):
        cell = LstmCell(inn, cell_dim, hidden, 3.0, 3.0, use_projection=True)
        cell.input_weight = weights(4 * cell_dim, inn)
        cell.recurrent_weight = weights(4 * cell_dim, hidden)
        cell.projection_weight = weights(hidden, cell_dim)
        cells.append(cell)
    inputs = [torch.randn(rows, inn, generator=generator) * 2 + 0.3 for _ in cells]
    biases = [torch.randn(4 * cell_dim, generator=generator) for _ in cells]
    h = torch.randn(2, rows, hidden, generator=generator)
    m = torch.randn(2, rows, cell_dim, generator=generator)
    with torch.no_grad():
        # The kernels as the step loop gets them, and its products (compiled_steps.step_loop).
        kernels = layer_kernels(cells, Bf16Layer())
        assert kernels.mode == "bfloat16"
        gates = torch.stack(
            [
                bf16_product(x, kernel).to(torch.float32).add_(bias)
                for x, kernel, bias in zip(inputs, kernels.input_kernels, biases)
            ]
        )
        z = bf16_product(h, kernels.recurrent[0]).to(torch.float32).add_(gates)
        projected = bf16_product(m, kernels.projection[0]).to(torch.float32)

    def product(x, weight):  # the bfloat16 scheme in float64, before rounding the result
        return to_bfloat16(x.numpy()) @ to_bfloat16(weight.detach().numpy()).T

    def check(got, exact, added):
        expected = to_bfloat16(exact) + added
        ulp = np.abs(exact) * 2.0**-7  # at least one bfloat16 step at the product's size
        assert np.all(np.abs(got.numpy() - expected) <= ulp + 1e-5 * np.abs(added) + 1e-6)
        assert np.abs(got.numpy() - (exact + added)).max() > 1e-4  # rounded, not float32

    for d, cell in enumerate(cells):
        input_product = product(inputs[d], cell.input_weight)
        check(gates[d], input_product, biases[d].numpy())
        check(z[d], product(h[d], cell.recurrent_weight), gates[d].numpy())
        check(projected[d], product(m[d], cell.projection_weight), 0.0)


def test_bf16_bilm_stays_close_to_float32_on_the_fixture(allennlp_fixture, sentences):
    bilm = load(allennlp_fixture)
    float32 = bilm.embed(sentences)
    assert quantized(bilm, "bf16") is bilm and bilm.quantize == "bf16"
    bf16 = bilm.embed(sentences)
    for layer in range(3):
        diff = np.concatenate([(q[layer] - f[layer]).ravel() for q, f in zip(bf16, float32)])
        if layer == 0:  # the char CNN stays in float32
            assert not diff.any()
            continue
        ref = np.concatenate([f[layer].ravel() for f in float32])
        relative = np.linalg.norm(diff) / np.linalg.norm(ref)
        assert 1e-4 < relative < BF16_RELATIVE_BOUND, (layer, relative)
        assert np.abs(diff).max() < BF16_ABSOLUTE_BOUND, (layer, np.abs(diff).max())


@pytest.mark.parametrize("mode", MODES)
def test_quantised_outputs_do_not_depend_on_the_batch(allennlp_fixture, sentences, mode):
    """Each value is rounded to bfloat16 on its own. A
    sentence alone or in a batch gives the same vectors (float32 rounding of the rest apart)."""
    bilm = quantized(load(allennlp_fixture), mode)
    bilm.token_cache_size = 0
    some = sentences[::3]  # 10 sentences of 3 to 53 tokens
    batched = bilm.embed(some, batch_size=10)
    for sentence, together in zip(some, batched):
        (alone,) = bilm.embed([sentence])
        np.testing.assert_allclose(alone, together, rtol=0, atol=2e-6)


@pytest.mark.parametrize("mode", MODES)
def test_switching_back_to_float32_is_exact(allennlp_fixture, sentences, mode):
    bilm = load(allennlp_fixture)
    float32 = bilm.embed(sentences[:6])
    quantized(bilm, mode)
    bilm.embed(sentences[:6])  # fills the token cache with quantised vectors
    set_quantize(bilm, "none")
    assert bilm.quantize is None
    for again, before in zip(bilm.embed(sentences[:6]), float32):
        np.testing.assert_array_equal(again, before)


@pytest.mark.parametrize("mode", MODES)
def test_projection_clip_holds_when_quantised(allennlp_fixture, sentences, mode):
    """The first LSTM layer's output is the clipped projection (no residual): never above
    proj_clip, and with a small clip the bound is reached exactly."""
    bilm = quantized(load(allennlp_fixture), mode)
    top = max(np.abs(e[1]).max() for e in bilm.embed(sentences))
    assert top <= bilm.options.proj_clip
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        for cell in stack.layers:
            cell.proj_clip = 0.25
    layer_one = np.concatenate([e[1].ravel() for e in bilm.embed(sentences)])
    assert np.abs(layer_one).max() == np.float32(0.25)


@pytest.mark.parametrize("mode", MODES)
def test_cell_clip_holds_when_quantised(allennlp_fixture, sentences, mode):
    """The carried cell states are the clipped c_t: never above cell_clip (reached with a
    small clip)."""
    bilm = quantized(load(allennlp_fixture, stateful=True), mode)
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        for cell in stack.layers:
            cell.cell_clip = 0.1
    bilm(batch_to_ids(sentences[:10]))
    cells = [c for states in bilm._carried_states.values() for _, c in states]
    assert max(float(c.abs().max()) for c in cells) == pytest.approx(0.1, abs=1e-7)
    hidden = [h for states in bilm._carried_states.values() for h, _ in states]
    assert max(float(h.abs().max()) for h in hidden) <= bilm.options.proj_clip


@pytest.mark.parametrize("mode", MODES)
def test_new_weights_are_quantised_again(allennlp_fixture, sentences, mode):
    bilm = quantized(load(allennlp_fixture), mode)
    bilm.embed(sentences[:3])  # quantised weights made from the first weights
    torch.manual_seed(0)
    other = BiLM(bilm.options)
    bilm.load_state_dict(other.state_dict())  # in place
    expected = quantized(other, mode).embed(sentences[:3])
    for got, want in zip(bilm.embed(sentences[:3]), expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_stay_quantised(allennlp_fixture, sentences, how, mode):
    bilm = quantized(load(allennlp_fixture), mode)
    expected = bilm.embed(sentences[:4])
    if how == "deepcopy":
        copied = copy.deepcopy(bilm)
    else:
        copied = pickle.loads(pickle.dumps(bilm))
    assert copied.quantize == mode
    for got, want in zip(copied.embed(sentences[:4]), expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
def test_autograd_runs_in_float32(allennlp_fixture, sentences, mode):
    """Where autograd records (fine-tuning), the products are float32 and differentiable."""
    bilm = load(allennlp_fixture)
    ids = batch_to_ids(sentences[:3])
    with torch.no_grad():
        float32 = bilm(ids).layers
    quantized(bilm, mode)
    layers = bilm(ids).layers
    assert layers.requires_grad
    torch.testing.assert_close(layers.detach(), float32, atol=1e-6, rtol=0)


def test_check_quantize():
    assert check_quantize(None) is None
    assert check_quantize("none") is None
    assert check_quantize("bf16") == "bf16"
    with pytest.raises(ValueError, match="'none', 'bf16' or null, got 'int8'"):
        check_quantize("int8")


@pytest.mark.parametrize("native", [False, True])
def test_bf16_warns_once_where_the_cpu_has_no_bfloat16_instructions(
    allennlp_fixture, monkeypatch, native
):
    from spacy_elmo.bilm import quantize

    monkeypatch.setattr(quantize, "bf16_is_native", lambda: native)
    quantize._warn_if_slow_here.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a second biLM: no second warning
            set_quantize(BiLM.load(allennlp_fixture), "bf16")
    slow = [w for w in caught if issubclass(w.category, quantize.Bf16SpeedWarning)]
    assert len(slow) == (0 if native else 1)
    if not native:
        assert "bfloat16" in str(slow[0].message) and "float32" in str(slow[0].message)
