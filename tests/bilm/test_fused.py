"""The fused training path of the LSTM cells (`fused.py`) against the reference stacks'
op-by-op autograd (`reference.LstmStack`) and against finite differences."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from spacy_elmo.bilm import fused, model, tokens
from spacy_elmo.bilm.lstm import run_stacks
from spacy_elmo.bilm.reference import LstmStack
from spacy_elmo.description.options import BiLMOptions
from spacy_elmo.pretrain.presets import preset

BATCH_SIZES = [4, 4, 3, 1]  # packed: four sequences of lengths 4, 3, 3, 1... sorted
LENGTHS = torch.tensor([4, 3, 3, 2])  # of the sequences BATCH_SIZES packs


def _stacks(use_projection: bool, clip: float | None, dim: int) -> list[LstmStack]:
    options = BiLMOptions.from_dict(preset("tiny"))
    lstm = dict(lstm_dim=10, projection_dim=dim, n_layers=2, use_skip_connections=True)
    options = options.__class__(**{**vars(options), **lstm, "cell_clip": clip, "proj_clip": clip})
    assert options.has_lstm_projection == use_projection
    stacks = [LstmStack(options).double() for _ in range(2)]
    for stack in stacks:
        for parameter in stack.parameters():
            torch.nn.init.uniform_(parameter, -0.8, 0.8)  # large enough for clipping to bite
    return stacks


def _gradients(stacks, inputs, outputs):
    weights = [
        torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape).sin() for d in outputs for o in d
    ]
    loss = sum((o * w).sum() for o, w in zip((o for d in outputs for o in d), weights))
    parameters = [*inputs, *(p for s in stacks for p in s.parameters())]
    return torch.autograd.grad(loss, parameters)


def _packed(padded: torch.Tensor) -> torch.Tensor:
    return pack_padded_sequence(padded, LENGTHS, batch_first=True).data


@pytest.mark.parametrize("use_projection", [True, False])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_fused_equals_op_by_op_autograd(use_projection, clip, monkeypatch):
    torch.manual_seed(0)
    dim = 6 if use_projection else 10
    hidden = 6 if use_projection else 10
    stacks = _stacks(use_projection, clip, dim)
    inputs = [
        torch.randn(sum(BATCH_SIZES), dim, dtype=torch.float64, requires_grad=True) for _ in stacks
    ]
    states = [
        [
            (torch.randn(4, hidden, dtype=torch.float64), torch.randn(4, 10, dtype=torch.float64))
            for _ in range(2)
        ]
        for _ in stacks
    ]
    # The reference: each direction over the padded sequences, one cell and step at a time.
    batch_sizes = torch.tensor(BATCH_SIZES)
    padded = [
        pad_packed_sequence(PackedSequence(x, batch_sizes), batch_first=True)[0] for x in inputs
    ]
    expected_outputs, expected_finals = [], []
    for stack, x, start in zip(stacks, padded, states):
        outputs, finals = stack(x, LENGTHS, start)
        expected_outputs.append([_packed(o) for o in outputs])
        expected_finals.append(finals)
    reference = (expected_outputs, expected_finals, _gradients(stacks, inputs, expected_outputs))
    outputs, finals = run_stacks(stacks, inputs, BATCH_SIZES, states, training=True)
    fused = (outputs, finals, _gradients(stacks, inputs, outputs))
    for ref_dir, fused_dir in zip(reference[0], fused[0]):
        for ref, got in zip(ref_dir, fused_dir):
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    for ref_dir, fused_dir in zip(reference[1], fused[1]):
        for (ref_h, ref_c), (h, c) in zip(ref_dir, fused_dir):
            torch.testing.assert_close(h, ref_h, rtol=0, atol=1e-12)
            torch.testing.assert_close(c, ref_c, rtol=0, atol=1e-12)
    for ref, got in zip(reference[2], fused[2]):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-10)
    if clip is not None:  # the test means something only if some values were clipped
        clipped = [o for o in fused[0][0]] if use_projection else [c for _, c in fused[1][0]]
        assert any((value.abs() == clip).any() for value in clipped)


def test_fused_cells_gradients_match_finite_differences():
    """The autograd node's hand-written backward pass, on its own."""
    torch.manual_seed(1)
    k, n_in, hidden, cell = 2, 3, 2, 4
    batch_sizes = [3, 2, 2, 1]

    def tensor(*shape):
        return (torch.rand(*shape, dtype=torch.float64) - 0.5).requires_grad_()

    x = tensor(k, sum(batch_sizes), n_in)
    weights = (tensor(k, 4 * cell, n_in), tensor(k, 4 * cell, hidden), tensor(k, 4 * cell))
    projection = tensor(k, hidden, cell)
    h0 = torch.rand(k, 3, hidden, dtype=torch.float64)
    c0 = torch.rand(k, 3, cell, dtype=torch.float64)

    def outputs(x, w_in, w_rec, bias, w_proj):
        # Clips wide enough that no value sits on a kink of the clamp.
        args = (w_in, w_rec, bias, w_proj, batch_sizes, 50.0, 50.0, 1 << 62)  # torch's tanh
        return fused._FusedCells.apply(x, h0, c0, *args)[0]

    assert torch.autograd.gradcheck(outputs, (x, *weights, projection))


def test_the_fused_path_is_taken_only_with_autograd(monkeypatch):
    """With autograd the cells run fused; without it, under autocast (the reference's forward
    pass) or with the fast paths off, never."""
    from spacy_elmo.bilm import BiLM, batch_to_ids

    torch.manual_seed(2)
    bilm = BiLM(BiLMOptions.from_dict(preset("tiny")))
    ids = batch_to_ids([["a", "river"], ["bank"]])
    calls = []
    run_cells = fused.run_cells

    def counted(*args):
        calls.append(len(args))
        return run_cells(*args)

    monkeypatch.setattr(fused, "run_cells", counted)
    with torch.no_grad():
        bilm(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bilm(ids)
    assert calls == []
    bilm(ids)
    assert len(calls) == bilm.options.n_layers  # one node per layer, both directions together
    monkeypatch.setattr(model, "FAST_PATHS", False)
    bilm(ids)
    assert len(calls) == bilm.options.n_layers


def test_char_cnn_on_trimmed_columns_equals_all_fifty():
    """Columns past the longest token + the widest filter hold only padding windows."""
    from spacy_elmo.bilm import BiLM, batch_to_ids

    torch.manual_seed(3)
    bilm = BiLM(BiLMOptions.from_dict(preset("tiny")))
    ids = batch_to_ids([["a", "river", "bank", "x" * 20, "🙂"]])[0]
    widest = max(width for width, _ in bilm.options.filters)
    assert widest == 3
    trimmed = tokens.trim_columns(ids, bilm.padding_id, widest)
    assert trimmed.shape[1] == 22 + 3  # the 20-byte token + begin/end of word, widest filter 3
    with torch.no_grad():
        fast = tokens.char_cnn(bilm.char_cnn, ids, bilm.padding_id, training=False)
        torch.testing.assert_close(fast, bilm.char_cnn(ids), rtol=0, atol=1e-6)
    long = batch_to_ids([["y" * 60]])[0]  # 48 bytes + 2: nothing to trim
    assert torch.equal(tokens.trim_columns(long, bilm.padding_id, widest), long)
