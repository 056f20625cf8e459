"""LSTM with projection and clipping, TF LSTMCell semantics (docs/MODEL.md §6).

Each direction of the biLM is a stack of these cells over packed sequences (rows sorted by
length, so the rows still active at a timestep are a prefix): the input products of all
timesteps at once, then one recurrent product per timestep. The forward and backward stacks
see the same lengths, so `run_stacks` steps both together, layer by layer (`run_cells` with
k = 2 cells).

The step is written once here, as a reference recorded op by op (`_run_cell` and
`_cell_update`). The fast paths, chosen in `run_cells` and tested against it, share one step
loop and one in-place cell update (`compiled_steps.py`): at inference as one TorchScript call
(`fast_paths.run_steps`; float32, or bfloat16 through `quantize.py`), and as the forward pass of
the fused training node (`fused.py`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from . import fast_paths, fused

# Gate blocks of width D, in the order of the bilm-tf weights: input, candidate, forget, output.
INPUT_GATE, CANDIDATE, FORGET_GATE, OUTPUT_GATE = range(4)
FORGET_BIAS = 1.0  # TF adds this at run time; it is not stored in the weights file

State = tuple[torch.Tensor, torch.Tensor]  # h (rows, P), c (rows, D)


class LstmCellWithProjection(nn.Module):
    """One TF LSTMCell(num_proj, cell_clip, proj_clip, forget_bias=1) over packed sequences."""

    # The bfloat16 kernels of its steps (with those of the cells stepped with it) that
    # `quantize.set_quantize` puts here; None: float32.
    bf16 = None

    def __init__(
        self,
        input_dim: int,
        cell_dim: int,
        projection_dim: int,
        cell_clip: float | None,
        proj_clip: float | None,
        use_projection: bool = True,
    ) -> None:
        super().__init__()
        hidden_dim = projection_dim if use_projection else cell_dim
        self.cell_dim = cell_dim
        self.hidden_dim = hidden_dim
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.input_weight = nn.Parameter(torch.empty(4 * cell_dim, input_dim))
        self.recurrent_weight = nn.Parameter(torch.empty(4 * cell_dim, hidden_dim))
        self.bias = nn.Parameter(torch.empty(4 * cell_dim))  # without the forget bias
        self.projection_weight = (
            nn.Parameter(torch.empty(projection_dim, cell_dim)) if use_projection else None
        )
        forget = torch.zeros(4 * cell_dim)
        forget[FORGET_GATE * cell_dim : (FORGET_GATE + 1) * cell_dim] = FORGET_BIAS
        self.register_buffer("forget_bias", forget, persistent=False)

    def forward(
        self, inputs: torch.Tensor, batch_sizes: list[int], state: State
    ) -> tuple[torch.Tensor, State]:
        """Run over packed `inputs` (sum of lengths, in); return packed h and final states.

        `batch_sizes[t]` is the number of sequences longer than t; `state` holds one row per
        sequence in the packed (length-sorted) order.
        """
        (output,), (final,) = run_cells([self], [inputs], batch_sizes, [state])
        return output, final


def run_cells(
    cells: Sequence[LstmCellWithProjection],
    inputs: Sequence[torch.Tensor],
    batch_sizes: list[int],
    states: Sequence[State],
) -> tuple[list[torch.Tensor], list[State]]:
    """Step k cells of the same shape together over packed inputs with the same `batch_sizes`.

    Cell d reads `inputs[d]` (N, in) from `states[d]`; the result is each cell's packed output
    (N, hidden) and final state, as `LstmCellWithProjection.forward` gives for one cell.
    """
    if fast_paths.fused_training(*inputs, modules=cells):  # autograd: one node (fused.py)
        return fused.run_cells(cells, inputs, batch_sizes, states)
    steps = fast_paths.inference_steps(cells, inputs[0])
    if steps is not None:  # no autograd: the fast paths' step loop (compiled_steps.py)
        return fast_paths.run_steps(steps, cells, inputs, batch_sizes, states)
    outputs, finals = zip(
        *(_run_cell(cell, x, batch_sizes, state) for cell, x, state in zip(cells, inputs, states))
    )
    return list(outputs), list(finals)


def _run_cell(
    cell: LstmCellWithProjection, inputs: torch.Tensor, batch_sizes: list[int], state: State
) -> tuple[torch.Tensor, State]:
    """The reference: one cell over packed `inputs` (N, in), recorded op by op."""
    h, c = state
    # Rows that finish at step t (those beyond batch_sizes[t + 1]) write their final state
    # here; the loop itself only carries the active prefix.
    final_h, final_c = h.clone(), c.clone()
    h, c = h[: batch_sizes[0]], c[: batch_sizes[0]]
    gates_from_input = F.linear(inputs, cell.input_weight, cell.bias + cell.forget_bias)
    outputs = []
    offset = 0  # packed rows: the start of this step
    for step, active in enumerate(batch_sizes):
        z = gates_from_input[offset : offset + active] + F.linear(h, cell.recurrent_weight)
        c_t, m_t = _cell_update(z, c, cell.cell_clip)  # (active, D) each
        if cell.projection_weight is None:
            h_t = m_t  # TF applies proj_clip only together with the projection
        else:
            h_t = F.linear(m_t, cell.projection_weight)  # (active, P)
            if cell.proj_clip is not None:
                h_t = h_t.clamp(-cell.proj_clip, cell.proj_clip)
        outputs.append(h_t)
        offset += active
        following = batch_sizes[step + 1] if step + 1 < len(batch_sizes) else 0
        if following < active:
            final_h[following:active] = h_t[following:]
            final_c[following:active] = c_t[following:]
        h, c = h_t[:following], c_t[:following]
    return torch.cat(outputs), (final_h, final_c)


def _cell_update(
    z: torch.Tensor, c: torch.Tensor, cell_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """New cell state c_t and m_t = o * tanh(c_t) from the gate pre-activations z (..., 4D)."""
    i, j, f, o = z.chunk(4, dim=-1)
    c_t = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
    if cell_clip is not None:
        c_t = c_t.clamp(-cell_clip, cell_clip)
    return c_t, torch.sigmoid(o) * torch.tanh(c_t)


class LstmStack(nn.Module):
    """L stacked cells of one direction, residual connections from the second layer on."""

    def __init__(
        self,
        n_layers: int,
        dim: int,
        cell_dim: int,
        cell_clip: float | None,
        proj_clip: float | None,
        use_skip_connections: bool,
        use_projection: bool = True,
    ) -> None:
        super().__init__()
        self.use_skip_connections = use_skip_connections
        self.dropout = 0.0  # on each layer's input, in training mode only (LM pretraining)
        self.layers = nn.ModuleList(
            LstmCellWithProjection(dim, cell_dim, dim, cell_clip, proj_clip, use_projection)
            for _ in range(n_layers)
        )

    def forward(
        self, inputs: torch.Tensor, batch_sizes: list[int], states: list[State]
    ) -> tuple[list[torch.Tensor], list[State]]:
        """Packed inputs (N, P) -> packed output of every layer, and final states per layer."""
        (outputs,), (final_states,) = run_stacks([self], [inputs], batch_sizes, [states])
        return outputs, final_states


def run_stacks(
    stacks: Sequence[LstmStack],
    inputs: Sequence[torch.Tensor],
    batch_sizes: list[int],
    states: Sequence[list[State]],
) -> tuple[list[list[torch.Tensor]], list[list[State]]]:
    """`LstmStack.forward` for stacks of the same shape, stepped together layer by layer.

    Returns, per stack, the packed output of every layer and the final state of every layer.
    """
    first = stacks[0]
    outputs: list[list[torch.Tensor]] = [[] for _ in stacks]
    final_states: list[list[State]] = [[] for _ in stacks]
    layer_inputs = list(inputs)
    for index in range(len(first.layers)):
        cells = [stack.layers[index] for stack in stacks]
        cell_inputs = [
            F.dropout(x, stack.dropout, stack.training) if stack.dropout else x
            for stack, x in zip(stacks, layer_inputs)
        ]
        layer_states = [stack_states[index] for stack_states in states]
        layer_outputs, layer_finals = run_cells(cells, cell_inputs, batch_sizes, layer_states)
        for d, stack in enumerate(stacks):
            output = layer_outputs[d]
            if index > 0 and stack.use_skip_connections:
                # The residual is added to the output, not to h.
                if fast_paths.at_inference(output, layer_inputs[d]):
                    output = output.add_(layer_inputs[d])
                else:
                    output = output + layer_inputs[d]
            outputs[d].append(output)
            final_states[d].append(layer_finals[d])
            layer_inputs[d] = output
    return outputs, final_states
