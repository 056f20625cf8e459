"""The engine (`bilm/tokens.py`, `bilm/lstm.py`, `bilm/compiled_steps.py`: oneDNN products,
batched GEMMs over both directions on weights laid out for them, in-place updates and output,
blocked input projections and char CNN) and the reference route of `model.FAST_PATHS = False`,
against NumPy and against each other."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from spacy_elmo import BiLM
from spacy_elmo.bilm import batch_to_ids, compiled_steps, lstm, model
from spacy_elmo.bilm import tokens as token_layer
from spacy_elmo.bilm.compiled_steps import cell_update_in_place
from spacy_elmo.bilm.quantize import Bf16SpeedWarning, set_quantize

from .numpy_reference import NumpyBiLM
from .test_reference import SENTENCES
from .util import tiny_options, write_random_model

NEVER, ALWAYS = 1 << 62, 0

# kernel thresholds and block sizes per path; "plain" is F.linear and one GEMM per direction;
# "reference" has every fast path off (the forward pass of `reference.py`).
PATHS = {
    "reference": dict(onednn=NEVER, stacked=-1, enabled=False),
    "plain": dict(onednn=NEVER, stacked=-1),
    "onednn": dict(onednn=ALWAYS, stacked=-1),
    "stacked": dict(onednn=NEVER, stacked=NEVER),
    "onednn_stacked": dict(onednn=ALWAYS, stacked=NEVER),
    "one_step_blocks": dict(onednn=ALWAYS, stacked=-1, gate_block=1, cnn_block=1),
    "tanh_via_sigmoid": dict(onednn=NEVER, stacked=NEVER, tanh_min=0),
    "tanh_kernel": dict(onednn=NEVER, stacked=NEVER, tanh_min=NEVER),
    "python_steps": dict(onednn=NEVER, stacked=NEVER, compiled=False),
}


def use_path(
    monkeypatch,
    onednn,
    stacked,
    gate_block=None,
    cnn_block=None,
    enabled=True,
    tanh_min=None,
    compiled=True,
):
    """Choose a path (before the BiLM is built: `lstm.lay_out` follows the kernel sizes)."""
    if onednn == ALWAYS and not lstm.ONEDNN:
        pytest.skip("oneDNN is not available in this torch build")
    monkeypatch.setattr(model, "FAST_PATHS", enabled)
    monkeypatch.setattr(lstm, "COMPILED_STEPS", compiled)
    monkeypatch.setattr(lstm, "ONEDNN_MIN_ELEMENTS", onednn)
    monkeypatch.setattr(lstm, "STACKED_MAX_ELEMENTS", stacked)
    if gate_block is not None:
        monkeypatch.setattr(lstm, "GATE_BLOCK_ROWS", gate_block)
    if cnn_block is not None:
        monkeypatch.setattr(token_layer, "CNN_BLOCK_BYTES", cnn_block)
    if tanh_min is not None:
        monkeypatch.setattr(lstm, "TANH_VIA_SIGMOID_MIN_ELEMENTS", tanh_min)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("model"), tiny_options(), seed=3)


@pytest.fixture(scope="module")
def reference(files):
    return NumpyBiLM(*files)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_matches_numpy(monkeypatch, files, reference, path):
    use_path(monkeypatch, **PATHS[path])
    bilm = BiLM.from_allennlp(*files)
    for batch_size in (1, 3):
        outputs = bilm.embed(SENTENCES, batch_size=batch_size)
        for tokens, got in zip(SENTENCES, outputs):
            np.testing.assert_allclose(got, reference.sentence(tokens)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("path", ["stacked", "onednn"])
def test_stateful_paths_agree_with_plain(monkeypatch, files, path):
    """Carried states go through the same kernels: three stateful calls, each path alike."""
    batches = [SENTENCES[:3], SENTENCES[1:], SENTENCES[::-1][:3]]
    results = {}
    for name in ("plain", path):
        use_path(monkeypatch, **PATHS[name])
        bilm = BiLM.from_allennlp(*files, stateful=True)
        results[name] = [bilm.embed(batch, batch_size=3) for batch in batches]
    for plain, chosen in zip(results["plain"], results[path]):
        for a, b in zip(plain, chosen):
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        dict(gate_block=1),  # a block of input gates per timestep
        dict(gate_block=5),
        dict(tanh_min=0),  # every tanh through the sigmoid
        dict(tanh_min=NEVER),  # torch's tanh kernel
        dict(stacked=-1),  # one product per direction
        dict(stacked=-1, onednn=ALWAYS),  # through oneDNN
    ],
    ids=["default", "block_1", "block_5", "tanh_via_sigmoid", "tanh_kernel", "single", "onednn"],
)
@pytest.mark.parametrize("stateful", [False, True])
@pytest.mark.parametrize("quantize", [None, "bf16"])
def test_compiled_step_loop_equals_the_python_loop(
    monkeypatch, files, settings, stateful, quantize
):
    """The step loop in TorchScript and as Python: the same kernels in the same order, float32
    or bfloat16: the same layers, final states included (three stateful calls in a row), bit
    for bit."""
    batches = [SENTENCES[:3], SENTENCES[1:], SENTENCES[::-1][:3]]
    results = {}
    for compiled in (False, True):
        chosen = dict(onednn=NEVER, stacked=NEVER) | settings
        use_path(monkeypatch, compiled=compiled, **chosen)
        bilm = BiLM.from_allennlp(*files, stateful=stateful)
        with warnings.catch_warnings():  # bf16 without bfloat16 instructions: slow, exact
            warnings.simplefilter("ignore", Bf16SpeedWarning)
            set_quantize(bilm, quantize)
        calls = []
        with torch.no_grad():
            for batch in batches:
                output = bilm(batch_to_ids(batch))
                calls.append([output.layers.clone(), *[s.clone() for s in _states(bilm)]])
        results[compiled] = calls
    for python, compiled in zip(results[False], results[True]):
        assert len(python) == len(compiled)
        for a, b in zip(python, compiled):
            assert torch.equal(a, b)


def _states(bilm):
    """The carried LSTM states of a stateful BiLM (none for a stateless one)."""
    return [t for states in bilm._carried_states.values() for state in states for t in state]


def test_which_biLMs_release_the_gil(monkeypatch, files):
    """Every biLM on the CPU, float32 or bfloat16, batched or not, steps in the compiled loop;
    none with the Python steps or on the reference route."""
    use_path(monkeypatch, onednn=NEVER, stacked=NEVER)
    bilm = BiLM.from_allennlp(*files)
    assert bilm.steps_release_gil()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Bf16SpeedWarning)
        assert set_quantize(bilm, "bf16").steps_release_gil()
    use_path(monkeypatch, onednn=NEVER, stacked=-1)  # kernels too large to batch
    assert BiLM.from_allennlp(*files).steps_release_gil()
    monkeypatch.setattr(lstm, "COMPILED_STEPS", False)
    assert not bilm.steps_release_gil()
    monkeypatch.setattr(lstm, "COMPILED_STEPS", True)
    monkeypatch.setattr(model, "FAST_PATHS", False)
    assert not bilm.steps_release_gil()


def test_the_compiled_loop_is_used_at_inference_only(monkeypatch, files):
    """Inference on the CPU takes the compiled loop; with autograd the fused cells run."""
    use_path(monkeypatch, onednn=NEVER, stacked=NEVER)
    calls = []
    compiled = lstm.compiled_loop()

    def counted(*args):
        calls.append(1)
        return compiled(*args)

    monkeypatch.setattr(lstm, "compiled_loop", lambda: counted)
    bilm = BiLM.from_allennlp(*files)
    with torch.no_grad():
        bilm(batch_to_ids(SENTENCES[:2]))
    assert len(calls) == bilm.options.n_layers  # one call per layer, both directions in it
    bilm(batch_to_ids(SENTENCES[:2])).layers.sum().backward()
    assert len(calls) == bilm.options.n_layers


def test_stacked_kernels_follow_weight_changes(monkeypatch, files, tmp_path):
    """An in-place change of a weight reaches the batched step (its kernels are the weights)."""
    use_path(monkeypatch, **PATHS["stacked"])
    bilm = BiLM.from_allennlp(*files)
    before = bilm.embed(SENTENCES[:1])[0]
    with torch.no_grad():
        bilm.backward_lstm.layers[1].recurrent_weight.mul_(-0.5)
        bilm.forward_lstm.layers[0].projection_weight.add_(0.25)
    after = bilm.embed(SENTENCES[:1])[0]
    assert np.abs(after[1:] - before[1:]).max() > 1e-3
    bilm.to_allennlp(tmp_path / "options.json", tmp_path / "weights.hdf5")
    expected = NumpyBiLM(tmp_path / "options.json", tmp_path / "weights.hdf5")
    np.testing.assert_allclose(after, expected.sentence(SENTENCES[0])[0], atol=1e-5, rtol=0)


def test_one_direction_stack_equals_the_lockstep_run(files):
    """run_stacks on one direction alone gives what it gives for it beside the other."""
    bilm = BiLM.from_allennlp(*files)
    rng = torch.Generator().manual_seed(0)
    batch_sizes = [3, 3, 2, 1]
    inputs = [torch.randn(sum(batch_sizes), 8, generator=rng) for _ in range(2)]
    states = [
        [(torch.randn(3, 8, generator=rng), torch.randn(3, 24, generator=rng)) for _ in range(2)]
        for _ in range(2)
    ]
    stacks = [bilm.forward_lstm, bilm.backward_lstm]
    with torch.inference_mode():
        together, together_final = lstm.run_stacks(stacks, inputs, batch_sizes, states, False)
        for d, stack in enumerate(stacks):
            (alone,), (alone_final,) = lstm.run_stacks(
                [stack], [inputs[d]], batch_sizes, [states[d]], False
            )
            # The two runs use different GEMM kernels (batched against per direction): equal up
            # to float32 rounding, amplified a little by the recurrence.
            for a, b in zip(alone, together[d]):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
            for (h1, c1), (h2, c2) in zip(alone_final, together_final[d]):
                torch.testing.assert_close(h1, h2, atol=1e-5, rtol=0)
                torch.testing.assert_close(c1, c2, atol=1e-5, rtol=0)


def test_stacked_kernels_share_the_weights_storage(monkeypatch, files, reference):
    """The batched step's (k, in, out) kernels are the weights themselves (laid out so when the
    model is loaded), not copies; the weights stay ordinary Parameters: same values through
    inference, trainable, saved and reloaded exactly."""
    use_path(monkeypatch, **PATHS["stacked"])
    bilm = BiLM.from_allennlp(*files)
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    parameters = list(bilm.parameters())
    bilm.embed(SENTENCES[:2])
    assert list(bilm.parameters()) == parameters  # the same Parameter objects
    for key, value in bilm.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert_stacked_views(bilm)
    # Training through the shared weights: the gradient of a weight in a view is its own.
    loss = bilm(batch_to_ids([SENTENCES[0]])).layers.sum()
    loss.backward()
    weight = bilm.backward_lstm.layers[1].recurrent_weight
    assert weight.grad is not None and weight.grad.shape == weight.shape
    assert weight.grad.abs().sum() > 0
    # Saved and reloaded: still the reference's outputs.
    bilm.zero_grad()
    reloaded = BiLM.load(_saved(bilm, files[0].parent / "saved"))
    for tokens, got in zip(SENTENCES, reloaded.embed(SENTENCES)):
        np.testing.assert_allclose(got, reference.sentence(tokens)[0], atol=1e-5, rtol=0)


def _saved(bilm, directory):
    bilm.save(directory)
    return directory


def layer_cells(bilm, layer):
    return [stack.layers[layer] for stack in (bilm.forward_lstm, bilm.backward_lstm)]


def assert_stacked_views(bilm):
    """Each layer's batched-step kernels are views of its weights' memory, not copies."""
    for layer in range(bilm.options.n_layers):
        cells = layer_cells(bilm, layer)
        with torch.no_grad():
            kernels = lstm.layer_kernels(cells)
        assert kernels.mode == "batched"
        (recurrent,), (projection,) = kernels.recurrent, kernels.projection
        for name, stacked in (("recurrent_weight", recurrent), ("projection_weight", projection)):
            for d, cell in enumerate(cells):
                weight = getattr(cell, name)
                assert weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
                assert weight.data_ptr() == stacked[d].data_ptr()
                assert torch.equal(weight, stacked[d].t())


def test_copies_are_laid_out_again_and_keep_no_hidden_state(monkeypatch, files):
    """A deep copy or a pickled and loaded BiLM has its weights laid out for the batched step
    again and gives the same outputs bit for bit; running leaves nothing in the cells."""
    use_path(monkeypatch, **PATHS["stacked"])
    bilm = BiLM.from_allennlp(*files)
    attributes = [set(vars(cell)) for stack in (bilm.forward_lstm, bilm.backward_lstm)
                  for cell in stack.layers]  # fmt: skip
    expected = bilm.embed(SENTENCES)
    assert attributes == [set(vars(cell)) for stack in (bilm.forward_lstm, bilm.backward_lstm)
                          for cell in stack.layers]  # fmt: skip
    for other in (copy.deepcopy(bilm), pickle.loads(pickle.dumps(bilm))):
        assert_stacked_views(other)
        for a, b in zip(other.embed(SENTENCES), expected):
            np.testing.assert_array_equal(a, b)


def test_moved_models_are_laid_out_again(monkeypatch, files, reference):
    """`.to()` another dtype (as another device does) gives every weight its own memory; the BiLM
    lays them out again, so the batched step still multiplies views, and the outputs stay the
    reference's (float64 there and back)."""
    use_path(monkeypatch, **PATHS["stacked"])
    bilm = BiLM.from_allennlp(*files)
    parameters = list(bilm.parameters())
    expected = bilm.embed(SENTENCES)
    for dtype in (torch.float64, torch.float32):
        assert bilm.to(dtype) is bilm
        assert list(bilm.parameters()) == parameters
        assert all(p.dtype == dtype for p in parameters)
        assert_stacked_views(bilm)
    for tokens, got, before in zip(SENTENCES, bilm.embed(SENTENCES), expected):
        np.testing.assert_array_equal(got, before)
        np.testing.assert_allclose(got, reference.sentence(tokens)[0], atol=1e-5, rtol=0)
    # A move that changes nothing keeps the weights where they are; shared memory keeps the
    # layout (the laid-out weights are not copied out of it again).
    where = [p.data_ptr() for p in parameters]
    bilm.to(torch.float32)
    assert [p.data_ptr() for p in parameters] == where
    bilm.share_memory()
    assert all(p.is_shared() for p in parameters)
    assert_stacked_views(bilm)


def test_weights_that_lost_the_layout_are_stacked_per_call(monkeypatch, files, reference):
    """Weights given their own memory (assigned to `.data`): the batched
    step multiplies copies of them, and follows later changes."""
    use_path(monkeypatch, **PATHS["stacked"])
    bilm = BiLM.from_allennlp(*files)
    expected = bilm.embed(SENTENCES)
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        for cell in stack.layers:
            for weight in (cell.recurrent_weight, cell.projection_weight):
                weight.data = weight.detach().clone(memory_format=torch.contiguous_format)
    cells = layer_cells(bilm, 0)
    with torch.no_grad():
        (recurrent,) = lstm.layer_kernels(cells).recurrent
    assert recurrent.data_ptr() not in {cell.recurrent_weight.data_ptr() for cell in cells}
    assert torch.equal(recurrent[1], cells[1].recurrent_weight.t())
    for a, b in zip(bilm.embed(SENTENCES), expected):
        np.testing.assert_array_equal(a, b)  # the same (in, out) GEMM on the same values
    with torch.no_grad():
        cells[1].recurrent_weight.mul_(-0.5)
    changed = bilm.embed(SENTENCES[:1])[0]
    assert np.abs(changed[1:] - expected[0][1:]).max() > 1e-3


def test_the_switch_turns_the_engine_off(monkeypatch, files, reference):
    """`model.FAST_PATHS = False`: every call the forward pass of `reference.py` (no fast char
    CNN, no packed LSTM, no token cache); the reference's numbers."""
    use_path(monkeypatch, onednn=NEVER, stacked=NEVER, enabled=False)
    bilm = BiLM.from_allennlp(*files)
    fast = []
    monkeypatch.setattr(token_layer, "token_vectors", lambda *args: fast.append(args))
    monkeypatch.setattr(lstm, "run", lambda *args: fast.append(args))
    for tokens, got in zip(SENTENCES, bilm.embed(SENTENCES)):
        np.testing.assert_allclose(got, reference.sentence(tokens)[0], atol=1e-5, rtol=0)
    assert not bilm.token_cache.rows and not fast


@pytest.mark.parametrize(
    "environment, fast, onednn",
    [
        ({}, True, True),
        ({"SPACY_ELMO_REFERENCE": "1"}, False, True),
        ({"SPACY_ELMO_REFERENCE": "0", "SPACY_ELMO_DISABLE_ONEDNN": "1"}, True, False),
    ],
)
def test_the_environment_sets_the_switches(environment, fast, onednn):
    """Read once, when the modules are imported (in a fresh interpreter here)."""
    names = ("SPACY_ELMO_REFERENCE", "SPACY_ELMO_DISABLE_ONEDNN")
    env = {k: v for k, v in os.environ.items() if k not in names} | environment
    code = "from spacy_elmo.bilm import lstm, model; print(model.FAST_PATHS, lstm.ONEDNN)"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    expected_onednn = onednn and torch.backends.mkldnn.is_available()
    assert result.stdout.split() == [str(fast), str(expected_onednn)]


@pytest.mark.parametrize("path", ["reference", "plain", "stacked", "onednn"])
def test_inference_forward_equals_the_autograd_forward(monkeypatch, files, path):
    """Without autograd `forward` writes packed rows in place; with it, it pads and stacks."""
    use_path(monkeypatch, **PATHS[path])
    bilm = BiLM.from_allennlp(*files)
    char_ids = batch_to_ids([SENTENCES[2], SENTENCES[0], [], SENTENCES[1]])
    with torch.inference_mode():
        inference = bilm(char_ids)
    slow = bilm(char_ids)
    assert slow.layers.requires_grad and not inference.layers.requires_grad
    torch.testing.assert_close(inference.layers, slow.layers.detach(), atol=1e-6, rtol=0)
    assert torch.equal(inference.mask, slow.mask)
    assert not inference.layers[:, ~inference.mask].any()  # padding is exactly zero


@pytest.mark.skipif(not lstm.ONEDNN, reason="oneDNN is not available in this torch build")
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_onednn_linear_matches_float64(monkeypatch, rows):
    monkeypatch.setattr(lstm, "ONEDNN_MIN_ELEMENTS", ALWAYS)
    rng = np.random.default_rng(rows)
    x, w = rng.standard_normal((rows, 48)), rng.standard_normal((64, 48)) / 7
    bias, add = rng.standard_normal(64), rng.standard_normal((rows, 64))
    t = {
        name: torch.tensor(a, dtype=torch.float32)
        for name, a in dict(x=x, w=w, b=bias, a=add).items()
    }
    with torch.inference_mode():
        assert lstm.uses_onednn(t["w"])
        plain = compiled_steps.linear(t["x"], t["w"], None, None, True)
        full = compiled_steps.linear(t["x"], t["w"], t["b"], t["a"], True)
    np.testing.assert_allclose(plain.numpy(), x @ w.T, atol=1e-5, rtol=0)
    np.testing.assert_allclose(full.numpy(), x @ w.T + bias + add, atol=1e-5, rtol=0)


def test_onednn_is_not_used_for_other_dtypes(monkeypatch):
    monkeypatch.setattr(lstm, "ONEDNN_MIN_ELEMENTS", ALWAYS)
    assert not lstm.uses_onednn(torch.randn(5, 6).double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tanh_min", [0, NEVER])
def test_the_cell_update_matches_float64(dtype, tanh_min):
    """`cell_update_in_place`, tanh through the sigmoid (tanh_min 0) or torch's kernel, against
    the cell's maths in float64 (docs/MODEL.md §6.1) over gates where tanh is not yet +-1: in
    float32 within a few float32 ulps."""
    z = torch.linspace(-6, 6, 4 * 30_000, dtype=torch.float64).reshape(30_000, 4)
    z = z[torch.randperm(30_000, generator=torch.Generator().manual_seed(0))].reshape(1, -1, 4)
    z = z.transpose(1, 2).reshape(1, -1)  # (1, 4D): the i, j, f, o blocks
    c = torch.linspace(-3, 3, 30_000, dtype=torch.float64)[None]
    i, j, f, o = z.chunk(4, dim=-1)
    want_c = (torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)).clamp(-3.5, 3.5)
    want_m = torch.sigmoid(o) * torch.tanh(want_c)
    got_c, got_m = cell_update_in_place(z.to(dtype), c.to(dtype), 3.5, tanh_min)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(got_c.double(), want_c, atol=tolerance, rtol=0)
    torch.testing.assert_close(got_m.double(), want_m, atol=tolerance, rtol=0)
