"""The fast paths' LSTM step loop and their one in-place cell update (why, and when they
run: `fast_paths.py`; the reference they are tested against: `lstm.py`).

`step_loop` steps k cells together over packed inputs without autograd, with the products in
float32 (one batched GEMM for the k cells, or one product per cell, through oneDNN for large
kernels) or in bfloat16 (`quantize.py`); `CompiledSteps` holds the kernels. At inference
`run` calls it as one TorchScript call that releases the GIL (a loop in Python takes it back
for each of a dozen small ops per step), so another Python thread (the tagger and NER after the
`elmo` component in `nlp.pipe`) runs beside it; the same function run as Python gives the same
numbers, bit for bit. The fused training path runs it as Python, keeping the activations its
backward pass reads (`fused.py`). TorchScript is deprecated in favour of `torch.compile`, which
needs a C++ compiler at run time; a loop in TorchScript needs none, and is the one way torch
offers to run it without the GIL.

This module imports nothing of the package: `fast_paths.py` decides when it applies.
"""

from __future__ import annotations

import warnings
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

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
    """The kernels of a step of k cells for `step_loop`, in `precision` ("float32" or
    "bfloat16"). Per cell the input kernel (float32: the (4D, in) weight; bfloat16: an
    (in, out) kernel). The recurrent and projection kernels: where `batched`, one (k, in, out)
    stack each, multiplied for all k cells in one GEMM (a list of one); else the k cells'
    (out, in) weights, one product per cell. No projection: an empty list. `onednn`: whether
    the input, recurrent and projection products of one cell go through oneDNN's inner product
    (float32, one product per cell)."""

    precision: str
    input_kernels: list[torch.Tensor]
    recurrent: list[torch.Tensor]
    projection: list[torch.Tensor]
    batched: bool
    onednn: list[bool]


def run(
    steps: CompiledSteps,
    inputs: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    h: torch.Tensor,
    c: torch.Tensor,
    batch_sizes: list[int],
    cell_clip: float | None,
    proj_clip: float | None,
    block_rows: int,
    tanh_min_elements: int,
    compiled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`step_loop` for k cells stepped together, as one TorchScript call that releases the
    GIL where `compiled` (and `compiled_loop` is there), else as Python: packed output
    (k, N, P) and final h (k, rows, P) and c (k, rows, D)."""
    loop = compiled_loop() if compiled else None
    return (loop or step_loop)(
        list(inputs),
        steps.input_kernels,
        list(biases),
        steps.recurrent,
        steps.projection,
        steps.precision,
        steps.batched,
        steps.onednn,
        h,
        c,
        batch_sizes,
        cell_clip,
        proj_clip,
        block_rows,
        tanh_min_elements,
    )


_COMPILED: list = []


def compiled_loop():
    """`step_loop` in TorchScript, compiled on first use (about 0.3 s); None where this torch
    cannot compile it (a build without oneDNN's inner product, which it calls)."""
    if not _COMPILED:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated")
            try:
                _COMPILED.append(torch.jit.script(step_loop))
            except RuntimeError:
                _COMPILED.append(None)
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


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], add: Optional[torch.Tensor]
) -> torch.Tensor:
    """x (rows, in) weight^T (+ bias) (+ add) through oneDNN's inner product (float32, CPU;
    a private op of torch, `fast_paths.ONEDNN` says whether it is there)."""
    x = x.contiguous()
    if add is None:
        no_scalars = torch.jit.annotate(List[Optional[Union[int, float, complex]]], [])
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", no_scalars, "")
    return torch.ops.mkldnn._linear_pointwise(x, add.contiguous(), weight, bias, "add")


def input_gates(
    x: torch.Tensor,
    kernel: torch.Tensor,
    bias: torch.Tensor,
    precision: str,
    onednn: bool,
    out: Optional[torch.Tensor],
) -> torch.Tensor:
    """x (rows, in) W_input^T + bias (rows, 4D): written into `out` where given (always in
    bfloat16, whose kernels are batched), else new."""
    if precision == "bfloat16":
        assert out is not None
        return out.copy_(bf16_product(x, kernel)).add_(bias)
    if onednn:
        gates = onednn_linear(x, kernel, bias, None)
        return gates if out is None else out.copy_(gates)
    if out is None:
        return torch.addmm(bias, x, kernel.t())
    return torch.addmm(bias, x, kernel.t(), out=out)


def recurrent_gates(
    h: torch.Tensor,
    blocks: List[torch.Tensor],
    start: int,
    kernels: List[torch.Tensor],
    precision: str,
    batched: bool,
    onednn: bool,
) -> torch.Tensor:
    """z (k, active, 4D): h (k, active, hidden) W_recurrent^T plus the input gates of this
    step, rows `start` to `start + active` of each cell's block of input gates (`blocks`, the
    k cells' (rows, 4D), or one (k, rows, 4D) where `batched`)."""
    active = h.shape[1]
    if batched:
        rows = blocks[0][:, start : start + active]
        if precision == "bfloat16":
            return bf16_product(h, kernels[0]).to(torch.float32).add_(rows)
        return torch.baddbmm(rows, h, kernels[0])
    z = h.new_empty((h.shape[0], active, blocks[0].shape[1]))
    for d in range(len(kernels)):
        rows = blocks[d][start : start + active]
        if onednn:
            z[d].copy_(onednn_linear(h[d], kernels[d], None, rows))
        else:
            torch.addmm(rows, h[d], kernels[d].t(), out=z[d])
    return z


def project(
    m: torch.Tensor,
    kernels: List[torch.Tensor],
    precision: str,
    batched: bool,
    onednn: bool,
    out: torch.Tensor,
) -> None:
    """m (k, active, D) W_projection^T, written into `out` (k, active, P)."""
    if precision == "bfloat16":
        out.copy_(bf16_product(m, kernels[0]).to(torch.float32))
    elif batched:
        torch.bmm(m, kernels[0], out=out)
    else:
        for d in range(len(kernels)):
            if onednn:
                out[d].copy_(onednn_linear(m[d], kernels[d], None, None))
            else:
                torch.mm(m[d], kernels[d].t(), out=out[d])


def step_loop(
    inputs: list[torch.Tensor],
    input_kernels: list[torch.Tensor],
    biases: list[torch.Tensor],
    recurrent: list[torch.Tensor],
    projection: list[torch.Tensor],
    precision: str,
    batched: bool,
    onednn: list[bool],
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
    """The LSTM step loop of the fast paths, without autograd (`CompiledSteps` describes the
    kernels): k cells stepped together over packed inputs, the maths of `lstm.run_cells`
    (TorchScript: no calls into the rest of the package). At inference `run` calls it; the
    fused training path runs it as Python with the (k, N, 4D) `kept_gates` and (k, N, D)
    `kept_cells` and `kept_hidden` (where there is a projection) that its backward pass reads:
    every step's activations, c_t and m_t (float32, batched kernels)."""
    k = h.shape[0]
    cell_dim = c.shape[2]
    width = 4 * cell_dim
    output = h.new_empty((k, inputs[0].shape[0], h.shape[2]))
    final_h, final_c = h.clone(), c.clone()
    h, c = h[:, : batch_sizes[0]], c[:, : batch_sizes[0]]
    blocks = [h.new_empty((0,))]  # each cell's block of input gates, or one of all k
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
            blocks = [h.new_empty((0,))]  # freed before the next block is allocated
            gates: Optional[torch.Tensor] = None  # the k cells' blocks as one (k, rows, 4D)
            if kept_gates is not None:
                gates = kept_gates[:, block_start:block_end]
            elif batched:
                gates = h.new_empty((k, block_end - block_start, width))
            blocks = []
            for d in range(k):
                x = inputs[d][block_start:block_end]
                out = None if gates is None else gates[d]
                blocks.append(
                    input_gates(x, input_kernels[d], biases[d], precision, onednn[0], out)
                )
            if gates is not None:
                blocks = [gates]
        start = offset - block_start  # this step's rows in the block
        if kept_gates is not None:  # the activations stay in kept_gates
            z = blocks[0][:, start : start + active].baddbmm_(h, recurrent[0])
        else:
            z = recurrent_gates(h, blocks, start, recurrent, precision, batched, onednn[1])
        h_t = output[:, offset : offset + active]
        kept_c: Optional[torch.Tensor] = None
        kept_m: Optional[torch.Tensor] = None
        if kept_cells is not None:
            kept_c = kept_cells[:, offset : offset + active]
        if len(projection) == 0:
            kept_m = h_t  # m_t is the output
        elif kept_hidden is not None:
            kept_m = kept_hidden[:, offset : offset + active]
        c_t, m_t = cell_update_in_place(z, c, cell_clip, tanh_min_elements, kept_c, kept_m)
        if len(projection) > 0:
            project(m_t, projection, precision, batched, onednn[2], h_t)
            if proj_clip is not None:
                h_t.clamp_(-proj_clip, proj_clip)
        offset += active
        following = batch_sizes[step + 1] if step + 1 < n_steps else 0
        if following < active:
            final_h[:, following:active] = h_t[:, following:]
            final_c[:, following:active] = c_t[:, following:]
        h, c = h_t[:, :following], c_t[:, :following]
    return output, final_h, final_c
