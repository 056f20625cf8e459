"""The fast step loop of the biLM's LSTM cells, written once (docs/MODEL.md §6; held against
`reference.LstmCell`), and the one in-place form of the cell update.

`step_loop` steps k cells of one shape together over packed rows (both directions of a layer).
`fused.py` runs it as the forward pass of its training node; at inference `lstm.py` runs it as
one TorchScript call that releases the GIL (`lstm.compiled_loop`). It imports nothing of the
package: `lstm.py` chooses the kernels it is given.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def cell_update_in_place(
    z: torch.Tensor,
    c: torch.Tensor,
    cell_clip: Optional[float],
    tanh_min_elements: int,
    kept_c: Optional[torch.Tensor] = None,
    kept_m: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The LSTM cell update without autograd (docs/MODEL.md §6, `reference.LstmCell.forward`
    op by op): from the gate pre-activations z (..., 4D) in bilm-tf order (i, j, f, o) and the
    cell state c (..., D), c_t = clip(sigmoid(f) c + sigmoid(i) tanh(j)) and m_t = sigmoid(o)
    tanh(c_t): one sigmoid over all four blocks, the products in place over z, and from
    `tanh_min_elements` elements on tanh(x) = 2 sigmoid(2x) - 1.

    At inference z is scratch (c_t is written over the forget gate's block). For `fused.py`'s
    backward pass `kept_c` takes c_t, `kept_m` (where given) m_t, and z ends holding the
    activations sigmoid(i), tanh(j), sigmoid(f), sigmoid(o)."""
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


def bf16_product(x: torch.Tensor, kernel: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """x (rows, in) or (k, rows, in) float32, rounded to bfloat16, times a bfloat16 kernel
    (in, out) or (k, in, out): (rows, out) or (k, rows, out) in bfloat16 (oneDNN sums in
    float32), with x's rows padded by zero rows to a multiple of `multiple`: oneDNN builds and
    caches a kernel per shape, and a step's rows take every value up to the batch's sentences."""
    # Each shape's kernel costs about 1.3 ms and 1 MB on AMX (docs/research/engine.md)
    rows = x.shape[-2]
    shape = list(x.shape)
    shape[-2] = (rows + multiple - 1) // multiple * multiple
    padded = torch.zeros(shape, dtype=torch.bfloat16)
    padded.narrow(-2, 0, rows).copy_(x)
    if x.dim() == 3:
        return torch.bmm(padded, kernel).narrow(-2, 0, rows)
    return torch.mm(padded, kernel).narrow(-2, 0, rows)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    add: Optional[torch.Tensor],
    onednn: bool,
) -> torch.Tensor:
    """x @ weight.T + bias + add for 2-d x (rows, in), weight (out, in), add (rows, out):
    through oneDNN's inner product (a private op of torch) where `onednn`, else `F.linear`."""
    # oneDNN: 1.9x F.linear for the original model's recurrent step (docs/research/engine.md)
    if onednn:
        x = x.contiguous()
        if add is None:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x, add.contiguous(), weight, bias, "add")
    y = torch.nn.functional.linear(x, weight, bias)
    if add is None:
        return y
    return y.add_(add)


def step_loop(
    inputs: List[torch.Tensor],
    input_kernels: List[torch.Tensor],
    biases: List[torch.Tensor],
    recurrent: List[torch.Tensor],
    projection: List[torch.Tensor],
    mode: str,
    onednn: List[bool],
    h: torch.Tensor,
    c: torch.Tensor,
    batch_sizes: List[int],
    cell_clip: Optional[float],
    proj_clip: Optional[float],
    block_rows: int,
    tanh_min_elements: int,
    kept_gates: Optional[torch.Tensor] = None,
    kept_cells: Optional[torch.Tensor] = None,
    kept_hidden: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k cells stepped together over packed rows, without autograd: cell d reads inputs[d]
    (N, in) from h[d] (rows, hidden) and c[d] (rows, D); returns the packed outputs (k, N,
    hidden) and the final h and c. The input gates are made for blocks of whole timesteps of
    at most `block_rows` rows, then each step adds its recurrent product.

    The products, as `lstm.layer_kernels` chose them (`input_kernels` per cell: (4D, in), in
    bfloat16 (in, 4D)):
    - "batched": `recurrent` and `projection` each one (k, in, out) stack, one GEMM per step;
    - "single": per cell (out, in) weights, one product each;
    - "bfloat16": (k, in, out) bfloat16 stacks (`bf16_product`).
    `onednn` says which of the input, recurrent and projection products of the float32 modes go
    through oneDNN (`linear`). `projection` is empty for cells without one.

    `fused.py` ("batched", float32) passes the (k, N, 4D) `kept_gates`, (k, N, D) `kept_cells`
    and, with a projection, `kept_hidden`: every step's activations, c_t and m_t."""
    k = h.shape[0]
    width = 4 * c.shape[2]
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
            gates = h.new_empty((0,))  # freed before the next block is allocated
            if kept_gates is None:
                gates = h.new_empty((k, block_end - block_start, width))
            else:
                gates = kept_gates[:, block_start:block_end]
            for d in range(k):
                x = inputs[d][block_start:block_end]
                if mode == "bfloat16":
                    gates[d].copy_(bf16_product(x, input_kernels[d])).add_(biases[d])
                elif onednn[0]:
                    gates[d].copy_(linear(x, input_kernels[d], biases[d], None, True))
                else:
                    torch.addmm(biases[d], x, input_kernels[d].t(), out=gates[d])
        rows = gates[:, offset - block_start : offset - block_start + active]
        if kept_gates is not None:  # the activations stay in kept_gates
            z = rows.baddbmm_(h, recurrent[0])
        elif mode == "batched":
            z = torch.baddbmm(rows, h, recurrent[0])
        elif mode == "bfloat16":
            z = bf16_product(h, recurrent[0]).to(torch.float32).add_(rows)
        else:
            z = torch.stack(
                [linear(h[d], recurrent[d], None, rows[d], onednn[1]) for d in range(k)]
            )
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
            if mode == "batched":
                torch.bmm(m_t, projection[0], out=h_t)
            elif mode == "bfloat16":
                h_t.copy_(bf16_product(m_t, projection[0]))
            else:
                for d in range(k):
                    h_t[d].copy_(linear(m_t[d], projection[d], None, None, onednn[2]))
            if proj_clip is not None:
                h_t.clamp_(-proj_clip, proj_clip)
        offset += active
        following = batch_sizes[step + 1] if step + 1 < n_steps else 0
        if following < active:
            final_h[:, following:active] = h_t[:, following:]
            final_c[:, following:active] = c_t[:, following:]
        h, c = h_t[:, :following], c_t[:, :following]
    return output, final_h, final_c
