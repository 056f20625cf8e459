"""LSTM with projection and clipping, TF LSTMCell semantics (docs/MODEL.md §6).

Each direction of the biLM is a stack of these cells over packed sequences (rows sorted by
length, so the rows still active at a timestep are a prefix): the input products of a block of
timesteps at once, then one recurrent product per timestep. The forward and backward stacks
see the same lengths, so `run_stacks` steps both together, layer by layer: `run_cells` with k = 2
cells, whose gate nonlinearities run in one kernel each.

The step is written once, here (`run_cells`' loop and `_cell_update`). Its three matrix
products come from the cells' `products` (`products.py`: float32, or bfloat16 through
`quantize.py`). The fast paths beside it, chosen in `run_cells` and tested against it, share
one in-place cell update and one step loop (`compiled_steps.py`): at inference scripted in
TorchScript, and as the forward pass of the fused training node (`fused.py`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from . import fast_paths, fused
from .products import Float32Products, MakeProducts

# Gate blocks of width D, in the order of the bilm-tf weights: input, candidate, forget, output.
INPUT_GATE, CANDIDATE, FORGET_GATE, OUTPUT_GATE = range(4)
FORGET_BIAS = 1.0  # TF adds this at run time; it is not stored in the weights file

State = tuple[torch.Tensor, torch.Tensor]  # h (rows, P), c (rows, D)

# The input projections are computed for blocks of whole timesteps of at most this many packed
# rows (at least one timestep), not for the whole batch at once: still a large GEMM, and 16 MB
# per direction for the original model, where a batch of 32 sentences of 40 tokens would hold
# 84 MB per direction.
GATE_BLOCK_ROWS = 256


class LstmCellWithProjection(nn.Module):
    """One TF LSTMCell(num_proj, cell_clip, proj_clip, forget_bias=1) over packed sequences."""

    # The products of its steps (with those of the cells stepped with it, as `run_cells` asks
    # the first cell): float32, or bfloat16 ones that `quantize.set_quantize` puts here.
    products: MakeProducts = Float32Products

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
    (N, hidden) and final state, as `LstmCellWithProjection.forward` gives for one cell. The
    products are those that the first cell's `products` makes.
    """
    first = cells[0]
    cell_clip, proj_clip = first.cell_clip, first.proj_clip
    if fast_paths.fused_training(*inputs, modules=cells):  # autograd: one node (fused.py)
        return fused.run_cells(cells, inputs, batch_sizes, states)
    products = first.products(cells, inputs)
    h = torch.stack([state[0] for state in states])  # (k, rows, hidden)
    c = torch.stack([state[1] for state in states])  # (k, rows, D)
    biases = [cell.bias + cell.forget_bias for cell in cells]
    compiled = getattr(products, "compiled_steps", None)
    steps = compiled() if compiled is not None else None
    if steps is not None:  # the loop below as one call, without the GIL (fast_paths.py)
        packed, final_h, final_c = fast_paths.run_compiled_steps(
            steps, inputs, biases, h, c, batch_sizes, cell_clip, proj_clip, GATE_BLOCK_ROWS
        )
        return list(packed.unbind(0)), list(zip(final_h.unbind(0), final_c.unbind(0)))
    # Rows that finish at step t (those beyond batch_sizes[t + 1]) write their final state
    # here; the loop itself only carries the active prefix, so there are no per-step copies.
    final_h, final_c = h.clone(), c.clone()
    h, c = h[:, : batch_sizes[0]], c[:, : batch_sizes[0]]
    outputs = []
    block_end = offset = 0  # packed rows: end of the block of input gates, start of this step
    for step, active in enumerate(batch_sizes):
        if offset == block_end:
            # The input projections of the next block of timesteps, (k, rows, 4D).
            block_start, block_end = offset, _block_end(batch_sizes, step, GATE_BLOCK_ROWS, offset)
            gates_from_input = None  # freed before the next block is allocated
            gates_from_input = products.input_gates(
                [x[block_start:block_end] for x in inputs], biases
            )
        start = offset - block_start  # this step's rows in the block
        z = products.recurrent_gates(h, gates_from_input, slice(start, start + active))
        c_t, m_t = _cell_update(z, c, cell_clip, products.in_place(z))  # (k, active, D) each
        if first.projection_weight is None:
            h_t = m_t  # TF applies proj_clip only together with the projection
        else:
            h_t = products.projection(m_t)  # (k, active, P)
            if proj_clip is not None:
                h_t = _clamp(h_t, proj_clip)
        outputs.append(h_t)
        offset += active
        following = batch_sizes[step + 1] if step + 1 < len(batch_sizes) else 0
        if following < active:
            final_h[:, following:active] = h_t[:, following:]
            final_c[:, following:active] = c_t[:, following:]
        h, c = h_t[:, :following], c_t[:, :following]
    packed = torch.cat(outputs, dim=1)  # (k, N, hidden)
    return list(packed.unbind(0)), list(zip(final_h.unbind(0), final_c.unbind(0)))


def _block_end(batch_sizes: list[int], step: int, max_rows: int, offset: int) -> int:
    """End row of the block of whole timesteps from `step` on with at most `max_rows` rows."""
    end = offset + batch_sizes[step]  # at least one timestep
    for active in batch_sizes[step + 1 :]:
        if end - offset + active > max_rows:
            break
        end += active
    return end


def _cell_update(
    z: torch.Tensor, c: torch.Tensor, cell_clip: float | None, in_place: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """New cell state c_t and m_t = o * tanh(c_t) from the gate pre-activations z (..., 4D),
    written over z where `in_place`."""
    if in_place:
        return fast_paths.cell_update(z, c, cell_clip)
    i, j, f, o = z.chunk(4, dim=-1)
    c_t = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
    if cell_clip is not None:
        c_t = c_t.clamp(-cell_clip, cell_clip)
    return c_t, torch.sigmoid(o) * torch.tanh(c_t)


def _clamp(x: torch.Tensor, clip: float) -> torch.Tensor:
    return x.clamp_(-clip, clip) if fast_paths.at_inference(x) else x.clamp(-clip, clip)


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
