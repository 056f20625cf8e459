"""The LSTM step loop in TorchScript, and the one in-place cell update (a fast path of
`lstm.run_cells`; why, and when it runs: `fast_paths.py`).

`cell_update_in_place` is the cell's maths without autograd, written over the gate
pre-activations: the Python step loop (through `fast_paths.cell_update`) and `step_loop` below
run it. `step_loop` is the one step loop of the fast paths: the fused training path runs it as
it is (`fused.py`, keeping what its backward pass reads), and at inference
`fast_paths.run_compiled_steps` calls it as one TorchScript call (`compiled_loop`): the same
kernels in the same order as the Python loop with the same products, so the same numbers, bit
for bit; what changes is that the whole loop runs in one call that releases the GIL (the Python
loop takes it back for each of a dozen small ops per step), so another Python thread (the
tagger and NER after the `elmo` component in `nlp.pipe`) runs beside it. TorchScript is
deprecated in favour of `torch.compile`, which needs a C++ compiler at run time; a loop in
TorchScript needs none, and is the one way torch offers to run it without the GIL.

This module imports nothing of the package: `fast_paths.py` decides when it applies.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Tuple

import torch


def cell_update_in_place(
    z: torch.Tensor,
    c: torch.Tensor,
    cell_clip: Optional[float],
    tanh_min_elements: int,
    kept_c: Optional[torch.Tensor] = None,
    kept_m: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The LSTM cell update without autograd (docs/MODEL.md §6; the reference, recorded op by
    op, is `lstm._cell_update`): from the gate pre-activations z (..., 4D) in bilm-tf order
    (input, candidate, forget, output) and the cell state c (..., D), the new cell state
    c_t = clip(sigmoid(f) c + sigmoid(i) tanh(j)) and m_t = sigmoid(o) tanh(c_t). One sigmoid
    over all four blocks, the products in place over z; from `tanh_min_elements` elements on,
    tanh(x) = 2 sigmoid(2x) - 1 (the candidate's from that one sigmoid).

    At inference z is scratch: c_t is written over the forget gate's block. For the fused
    training path (`fused.py`), whose backward pass needs the activations, `kept_c` (..., D)
    takes c_t and z ends holding sigmoid(i), tanh(j), sigmoid(f), sigmoid(o); `kept_m`, where
    given, takes m_t."""
    cell_dim = z.shape[-1] // 4
    j = z.narrow(-1, cell_dim, cell_dim)
    via_sigmoid = j.numel() >= tanh_min_elements
    tanh_j = j
    if via_sigmoid:
        j.mul_(2)
    else:
        tanh_j = torch.tanh(j)
    gate = z.sigmoid_()
    i = gate.narrow(-1, 0, cell_dim)
    f = gate.narrow(-1, 2 * cell_dim, cell_dim)
    o = gate.narrow(-1, 3 * cell_dim, cell_dim)
    if kept_c is None:
        if via_sigmoid:  # f c + i (2 sigmoid(2 j) - 1)
            c_t = f.mul_(c).addcmul_(i, j, value=2).sub_(i)
        else:
            c_t = f.mul_(c).addcmul_(i, tanh_j)
    else:
        if via_sigmoid:
            tanh_j = j.mul_(2).sub_(1)
        else:
            tanh_j = j.copy_(tanh_j)
        c_t = torch.mul(f, c, out=kept_c).addcmul_(i, tanh_j)
    if cell_clip is not None:
        c_t.clamp_(-cell_clip, cell_clip)
    if c_t.numel() >= tanh_min_elements:
        tanh_c = torch.mul(c_t, 2).sigmoid_().mul_(2).sub_(1)
    else:
        tanh_c = torch.tanh(c_t)
    if kept_m is None:
        return c_t, tanh_c.mul_(o)
    return c_t, torch.mul(tanh_c, o, out=kept_m)


class CompiledSteps(NamedTuple):
    """The arguments of the TorchScript step loop (`run_compiled_steps`) for the products of a
    step of k cells in `precision` ("float32" or "bfloat16"): per cell the input kernel
    (float32: (4D, in), bfloat16: (in, out)); the recurrent and projection kernels, each one
    (k, in, out) stack."""

    precision: str
    input_kernels: list[torch.Tensor]
    recurrent: torch.Tensor
    projection: torch.Tensor


_COMPILED: list = []


def compiled_loop():
    """`step_loop` in TorchScript, compiled on first use (about 0.2 s).

    Kept, though TorchScript is deprecated, for what releasing the GIL measured: the elmo
    pipeline with the biLM beside the tagger and NER at 12,285 words/s against 9,745 in turn
    (benchmarks/results/overlap_cpu.md, commit 8111d85, 2 threads)."""
    if not _COMPILED:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated")
            _COMPILED.append(torch.jit.script(step_loop))
    return _COMPILED[0]


def bf16_product(x: torch.Tensor, kernel: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """x (rows, in) or (k, rows, in) float32, rounded to bfloat16, times a bfloat16 kernel
    (in, out) or (k, in, out): (rows, out) or (k, rows, out) in bfloat16 (oneDNN sums in
    float32), with x's rows padded by zero rows to a multiple of `multiple`. oneDNN builds (and
    caches) a kernel for every shape it multiplies, about 1.3 ms and 1 MB each on AMX, and an
    LSTM step's rows take every value from 1 to the batch's sentences; padded, a few shapes
    serve them all."""
    rows = x.shape[-2]
    shape = list(x.shape)
    shape[-2] = (rows + multiple - 1) // multiple * multiple
    padded = torch.zeros(shape, dtype=torch.bfloat16)
    padded.narrow(-2, 0, rows).copy_(x)
    if x.dim() == 3:
        return torch.bmm(padded, kernel).narrow(-2, 0, rows)
    return torch.mm(padded, kernel).narrow(-2, 0, rows)


def _step_product(x: torch.Tensor, kernel: torch.Tensor, precision: str) -> torch.Tensor:
    """x (k, rows, in) times the (k, in, out) kernels: (k, rows, out) float32."""
    if precision == "bfloat16":
        return bf16_product(x, kernel).to(torch.float32)
    return torch.bmm(x, kernel)


def step_loop(
    inputs: list[torch.Tensor],
    input_kernels: list[torch.Tensor],
    biases: list[torch.Tensor],
    recurrent: torch.Tensor,
    projection: Optional[torch.Tensor],
    precision: str,
    h: torch.Tensor,
    c: torch.Tensor,
    batch_sizes: list[int],
    cell_clip: Optional[float],
    proj_clip: Optional[float],
    block_rows: int,
    tanh_min_elements: int,
    kept_gates: Optional[torch.Tensor] = None,
    kept_cells: Optional[torch.Tensor] = None,
    kept_hidden: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step loop of the fast paths, without autograd: the ops of `lstm.run_cells` with
    `lstm.Float32Products` or `quantize.Bf16Products`, in the same order (TorchScript: no
    calls into the rest of the package). Scripted at inference (`compiled_loop`); run as it is
    by the fused training path, which passes the (k, N, 4D) `kept_gates` and (k, N, D) `kept_cells`
    and `kept_hidden` (where there is a projection) that its backward pass reads: every
    step's activations, c_t and m_t (float32 products only)."""
    k = h.shape[0]
    cell_dim = c.shape[2]
    width = 4 * cell_dim
    output = h.new_empty((k, inputs[0].shape[0], h.shape[2]))
    final_h, final_c = h.clone(), c.clone()
    h, c = h[:, : batch_sizes[0]], c[:, : batch_sizes[0]]
    gates = h.new_empty((0,))
    block_start = 0
    block_end = 0
    offset = 0
    n_steps = len(batch_sizes)
    for step in range(n_steps):
        active = batch_sizes[step]
        if offset == block_end:  # the input gates of the next block of whole timesteps
            block_start = offset
            block_end = offset + active
            for later in range(step + 1, n_steps):
                if block_end - offset + batch_sizes[later] > block_rows:
                    break
                block_end += batch_sizes[later]
            gates = h.new_empty((0,))
            if kept_gates is None:
                gates = h.new_empty((k, block_end - block_start, width))
            else:
                gates = kept_gates[:, block_start:block_end]
            for d in range(k):
                x = inputs[d][block_start:block_end]
                if precision == "bfloat16":
                    gates[d].copy_(bf16_product(x, input_kernels[d])).add_(biases[d])
                else:
                    torch.addmm(biases[d], x, input_kernels[d].t(), out=gates[d])
        rows = gates[:, offset - block_start : offset - block_start + active]
        if kept_gates is not None:  # float32: the activations stay in kept_gates
            z = rows.baddbmm_(h, recurrent)
        elif precision == "float32":
            z = torch.baddbmm(rows, h, recurrent)
        else:
            z = _step_product(h, recurrent, precision).add_(rows)
        h_t = output[:, offset : offset + active]
        kept_c: Optional[torch.Tensor] = None
        kept_m: Optional[torch.Tensor] = None
        if kept_cells is not None:
            kept_c = kept_cells[:, offset : offset + active]
        if projection is None:
            kept_m = h_t  # m_t is the output
        elif kept_hidden is not None:
            kept_m = kept_hidden[:, offset : offset + active]
        c_t, m_t = cell_update_in_place(z, c, cell_clip, tanh_min_elements, kept_c, kept_m)
        if projection is not None:
            if precision == "float32":
                torch.bmm(m_t, projection, out=h_t)
            else:
                h_t.copy_(_step_product(m_t, projection, precision))
            if proj_clip is not None:
                h_t.clamp_(-proj_clip, proj_clip)
        offset += active
        following = batch_sizes[step + 1] if step + 1 < n_steps else 0
        if following < active:
            final_h[:, following:active] = h_t[:, following:]
            final_c[:, following:active] = c_t[:, following:]
        h, c = h_t[:, :following], c_t[:, :following]
    return output, final_h, final_c
