"""The fused training path of the LSTM cells (`fused.py`) against the op-by-op autograd path
and against finite differences."""

from __future__ import annotations

import pytest
import torch

from spacy_elmo.bilm import fast_paths, fused
from spacy_elmo.bilm.fused import fused_cells
from spacy_elmo.bilm.lstm import LstmStack, run_stacks

BATCH_SIZES = [4, 4, 3, 1]  # packed: four sequences of lengths 4, 3, 3, 1... sorted


def _stacks(use_projection: bool, clip: float | None, dim: int) -> list[LstmStack]:
    stacks = [
        LstmStack(2, dim, 10, clip, clip, True, use_projection=use_projection).double()
        for _ in range(2)
    ]
    for stack in stacks:
        for parameter in stack.parameters():
            torch.nn.init.uniform_(parameter, -0.8, 0.8)  # large enough for clipping to bite
    return stacks


def _run(stacks, inputs, states, fused: bool, monkeypatch):
    monkeypatch.setattr(fast_paths, "ENABLED", fused)  # off: the cells recorded op by op
    outputs, finals = run_stacks(stacks, inputs, BATCH_SIZES, states)
    weights = [
        torch.arange(o.numel(), dtype=o.dtype).reshape(o.shape).sin() for d in outputs for o in d
    ]
    loss = sum((o * w).sum() for o, w in zip((o for d in outputs for o in d), weights))
    parameters = [*inputs, *(p for s in stacks for p in s.parameters())]
    return outputs, finals, torch.autograd.grad(loss, parameters)


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
    reference = _run(stacks, inputs, states, False, monkeypatch)
    fused = _run(stacks, inputs, states, True, monkeypatch)
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
        return fused_cells(x, h0, c0, w_in, w_rec, bias, w_proj, batch_sizes, 50.0, 50.0)[0]

    assert torch.autograd.gradcheck(outputs, (x, *weights, projection))


def test_the_fused_path_is_taken_only_with_autograd(monkeypatch):
    """With autograd the cells run fused; without it, or under autocast, never."""
    monkeypatch.setattr(fast_paths, "ENABLED", True)
    torch.manual_seed(2)
    stacks = _stacks(True, 0.5, 6)
    inputs = [torch.randn(sum(BATCH_SIZES), 6, dtype=torch.float64) for _ in stacks]
    states = [[(torch.zeros(4, 6).double(), torch.zeros(4, 10).double())] * 2 for _ in stacks]
    calls = []

    def counted(*args):
        calls.append(len(args))
        return fused_cells(*args)

    monkeypatch.setattr(fused, "fused_cells", counted)
    with torch.no_grad():
        run_stacks(stacks, inputs, BATCH_SIZES, states)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        run_stacks(stacks, inputs, BATCH_SIZES, states)
    assert calls == []
    run_stacks(stacks, inputs, BATCH_SIZES, states)
    assert len(calls) == 2  # one node per layer, both directions together
    monkeypatch.setattr(fast_paths, "ENABLED", False)
    run_stacks(stacks, inputs, BATCH_SIZES, states)
    assert len(calls) == 2


def test_char_cnn_on_trimmed_columns_equals_all_fifty():
    """Columns past the longest token + the widest filter hold only padding windows."""
    from spacy_elmo.bilm import BiLM, batch_to_ids
    from spacy_elmo.description.options import BiLMOptions
    from spacy_elmo.pretrain.presets import preset

    torch.manual_seed(3)
    cnn = BiLM(BiLMOptions.from_dict(preset("tiny"))).char_cnn
    ids = batch_to_ids([["a", "river", "bank", "x" * 20, "🙂"]])[0]
    widest = max(width for width, _ in cnn.options.filters)
    assert widest == 3
    trimmed = fast_paths.trim_columns(ids, cnn.padding_id, widest)
    assert trimmed.shape[1] == 22 + 3  # the 20-byte token + begin/end of word, widest filter 3
    with torch.no_grad():
        full = cnn.projection(cnn.highways[0](torch.cat([cnn._features(row[None]) for row in ids])))
        torch.testing.assert_close(cnn(ids), full, rtol=0, atol=1e-6)
    long = batch_to_ids([["y" * 60]])[0]  # 48 bytes + 2: nothing to trim
    assert torch.equal(fast_paths.trim_columns(long, cnn.padding_id, widest), long)
