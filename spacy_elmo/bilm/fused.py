"""The LSTM cells where autograd records (training): the whole sequence as one autograd node.

The forward pass is `compiled_steps.step_loop`, keeping every step's activations; the backward
pass is back-propagation through time written out by hand, each weight's gradient one GEMM over
all timesteps. The maths is `reference.LstmCell`'s (docs/MODEL.md §6); the tests compare values
and gradients with it and with finite differences. No gradient reaches the initial states (zeros,
or carried states, detached anyway) or leaves the final states.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

import torch
from torch import nn

from . import compiled_steps


def run_cells(
    cells: Sequence[nn.Module],
    inputs: Sequence[torch.Tensor],
    batch_sizes: list[int],
    states: Sequence[tuple[torch.Tensor, torch.Tensor]],
    tanh_min_elements: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k cells (`reference.LstmCell`) over packed inputs with the same `batch_sizes`, from one
    (h, c) state each, as one autograd node (`_FusedCells`): the packed outputs (k, N, H) and
    the final h and c. Tensors of `tanh_min_elements` or more take tanh through the sigmoid."""
    first = cells[0]

    def stacked(name: str) -> torch.Tensor:
        return torch.stack([getattr(cell, name) for cell in cells])

    return _FusedCells.apply(
        torch.stack(list(inputs)),
        torch.stack([state[0] for state in states]),
        torch.stack([state[1] for state in states]),
        stacked("input_weight"),
        stacked("recurrent_weight"),
        torch.stack([cell.bias + cell.forget_bias for cell in cells]),
        stacked("projection_weight") if first.projection_weight is not None else None,
        batch_sizes,
        first.cell_clip,
        first.proj_clip,
        tanh_min_elements,
    )


# The hand-written backward: 1.14x the pretraining step recorded op by op (docs/research/engine.md)
class _FusedCells(torch.autograd.Function):
    """x (k, N, in); h0 (k, rows, H) and c0 (k, rows, D), which get no gradient; input_weight
    (k, 4D, in); recurrent_weight (k, 4D, H); bias (k, 4D), forget bias included;
    projection_weight (k, P, D) or None; gate blocks in bilm-tf order."""

    @staticmethod
    def forward(  # noqa: PLR0913
        ctx,
        x,
        h0,
        c0,
        input_weight,
        recurrent_weight,
        bias,
        projection_weight,
        batch_sizes,
        cell_clip,
        proj_clip,
        tanh_min_elements,
    ):
        k, n_rows, _ = x.shape
        cell_dim = recurrent_weight.shape[1] // 4
        gates = x.new_empty((k, n_rows, 4 * cell_dim))  # activations: i, tanh(j), f, o
        cells = x.new_empty((k, n_rows, cell_dim))  # c_t
        # m_t = o * tanh(c_t), the projection's input (without a projection: the output)
        hidden = x.new_empty((k, n_rows, cell_dim)) if projection_weight is not None else None
        outputs, final_h, final_c = compiled_steps.step_loop(
            list(x.unbind(0)),
            list(input_weight.unbind(0)),
            list(bias.unbind(0)),
            [recurrent_weight.transpose(1, 2).contiguous()],  # (k, H, 4D)
            [projection_weight.transpose(1, 2)] if projection_weight is not None else [],
            "batched",
            [False, False, False],
            h0,
            c0,
            batch_sizes,
            cell_clip,
            proj_clip,
            n_rows,  # the input gates of all steps in one product
            tanh_min_elements,
            gates,
            cells,
            hidden,
        )
        offsets = list(accumulate(batch_sizes, initial=0))[:-1]  # of each step's rows
        ctx.save_for_backward(
            x, h0, c0, input_weight, recurrent_weight, projection_weight, gates, cells, hidden,
            outputs,
        )  # fmt: skip
        ctx.batch_sizes = batch_sizes
        ctx.offsets = offsets
        ctx.clips = (cell_clip, proj_clip)
        ctx.tanh_min_elements = tanh_min_elements
        ctx.mark_non_differentiable(final_h, final_c)
        return outputs, final_h, final_c

    @staticmethod
    def backward(ctx, grad_output, _grad_h, _grad_c):
        (
            x,
            h0,
            c0,
            input_weight,
            recurrent_weight,
            projection_weight,
            gates,
            cells,
            hidden,
            outputs,
        ) = ctx.saved_tensors
        cell_clip, proj_clip = ctx.clips
        batch_sizes, offsets = ctx.batch_sizes, ctx.offsets
        k, n_rows, _ = x.shape
        cell_dim = recurrent_weight.shape[1] // 4
        grad_output = grad_output.contiguous()
        grad_gates = torch.empty_like(gates)  # dL/dz, (k, N, 4D)
        grad_hidden_raw = torch.empty_like(outputs) if projection_weight is not None else None
        # Gradients arriving from step t + 1 (rows beyond its batch size stay zero).
        grad_h_next = x.new_zeros((k, batch_sizes[0], outputs.shape[-1]))
        grad_c_next = x.new_zeros((k, batch_sizes[0], cell_dim))
        for step in range(len(batch_sizes) - 1, -1, -1):
            offset, active = offsets[step], batch_sizes[step]
            rows = slice(offset, offset + active)
            grad_h = grad_output[:, rows] + grad_h_next[:, :active]
            c_t = cells[:, rows]
            i, j, f, o = gates[:, rows].split(cell_dim, dim=-1)
            if projection_weight is None:
                grad_m = grad_h
            else:
                if proj_clip is not None:
                    grad_h.mul_(outputs[:, rows].abs() < proj_clip)
                grad_hidden_raw[:, rows] = grad_h
                grad_m = torch.bmm(grad_h, projection_weight)  # (k, active, D)
            if c_t.numel() >= ctx.tanh_min_elements:  # tanh through the sigmoid
                tanh_c = torch.mul(c_t, 2).sigmoid_().mul_(2).sub_(1)
            else:
                tanh_c = torch.tanh(c_t)
            # dL/dc_t: through m_t = o * tanh(c_t), plus what step t + 1 sends back.
            grad_c = grad_m * o * (1 - tanh_c * tanh_c) + grad_c_next[:, :active]
            if cell_clip is not None:
                grad_c.mul_(c_t.abs() < cell_clip)
            if step > 0:
                c_prev = cells[:, offsets[step - 1] : offsets[step - 1] + active]
            else:
                c_prev = c0[:, :active]
            grad_z = grad_gates[:, rows]
            gi, gj, gf, go = grad_z.split(cell_dim, dim=-1)
            torch.mul(grad_c, j, out=gi).mul_(i * (1 - i))
            torch.mul(grad_c, c_prev, out=gf).mul_(f * (1 - f))
            torch.mul(grad_m, tanh_c, out=go).mul_(o * (1 - o))
            torch.mul(grad_c, i, out=gj).mul_(1 - j * j)
            torch.mul(grad_c, f, out=grad_c_next[:, :active])
            torch.bmm(grad_z, recurrent_weight, out=grad_h_next[:, :active])
        # Each step's h_{t-1} row by row (h0 for the first step) for the recurrent weight's
        # gradient, as one product over all timesteps.
        previous = [h0[:, : batch_sizes[0]]] + [
            outputs[:, offsets[step - 1] : offsets[step - 1] + active]
            for step, active in enumerate(batch_sizes[1:], 1)
        ]
        grad_gates_t = grad_gates.transpose(1, 2)
        grad_recurrent = torch.bmm(grad_gates_t, torch.cat(previous, 1))
        grad_input_weight = torch.bmm(grad_gates_t, x)
        grad_bias = grad_gates.sum(dim=1)
        grad_x = torch.bmm(grad_gates, input_weight)
        grad_projection = (
            torch.bmm(grad_hidden_raw.transpose(1, 2), hidden)
            if projection_weight is not None
            else None
        )
        return (
            grad_x,
            None,
            None,
            grad_input_weight,
            grad_recurrent,
            grad_bias,
            grad_projection,
            None,
            None,
            None,
            None,
        )
