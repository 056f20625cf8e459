"""The fast step loop of the biLM's LSTM cells over packed sequences (docs/MODEL.md §6; the
cells themselves, and the plain step they are held against, are `reference.LstmCell`).

Rows are sorted by length, so the rows still active at a timestep are a prefix: the input
products of a block of timesteps at once, then one recurrent product per timestep. The forward
and backward stacks see the same lengths, so `run_stacks` steps both together, layer by layer:
`run_cells` with k = 2 cells. With autograd the whole sequence is one node (`fused.py`); at
inference every update is in place (`compiled_steps.cell_update_in_place`), and the loop runs
in TorchScript where the step's products give its arguments (`compiled_steps.step_loop`), or
here. The three matrix products of a step (input, recurrent, projection) are pluggable: float32
(`Float32Products`: one batched GEMM for both directions, oneDNN or `F.linear`, as
`fast_paths.py` decides) or bfloat16 (`quantize.Bf16Products`).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, Union

import torch
from torch.nn import functional as F

from . import compiled_steps, fast_paths, fused
from .reference import LstmCell, LstmStack, State

# ---------------------------------------------------------------------- the products of a step
Gates = Union[torch.Tensor, Sequence[torch.Tensor]]  # (k, rows, 4D), or k x (rows, 4D)


class Products(Protocol):
    """The matrix products of one step of the k cells that `lstm.run_cells` steps together:
    cell d's gates z = x W_input^T + b + h W_recurrent^T and its output m W_projection^T (the
    weights (out, in) of `reference.LstmCell`, b its bias with the forget bias)."""

    def input_gates(self, inputs: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]) -> Gates:
        """inputs[d] (rows, in) W_input^T + biases[d] for a block of packed rows, each (rows,
        4D), in the form that `recurrent_gates` reads."""
        ...

    def recurrent_gates(self, h: torch.Tensor, gates: Gates, rows: slice) -> torch.Tensor:
        """z (k, active, 4D): h (k, active, hidden) W_recurrent^T plus the `rows` (active of
        them) of the block's input gates."""
        ...

    def projection(self, m: torch.Tensor) -> torch.Tensor:
        """m (k, active, D) W_projection^T: (k, active, P), before the projection clip."""
        ...

    def compiled_steps(self) -> compiled_steps.CompiledSteps | None:
        """The arguments of the TorchScript step loop for these products, or None where the
        Python loop runs them (optional: products without it run in the Python loop)."""
        ...


class Float32Products:
    """The products in float32, the cells' default: one batched GEMM for the k cells where
    `fast_paths.stacked_kernels` applies, else one product per cell (`fast_paths.linear`)."""

    def __init__(self, cells: Sequence[LstmCell], inputs: Sequence[torch.Tensor]) -> None:
        self.cells = cells
        # The per-step kernels of all k cells for one batched GEMM, or None.
        self.stacked = fast_paths.stacked_kernels(cells)

    def input_gates(self, inputs: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]) -> Gates:
        if self.stacked is not None:
            return fast_paths.stacked_linear(
                inputs, [cell.input_weight for cell in self.cells], biases
            )
        return [
            fast_paths.linear(x, cell.input_weight, bias)
            for cell, x, bias in zip(self.cells, inputs, biases)
        ]  # k x (rows, 4D)

    def recurrent_gates(self, h: torch.Tensor, gates: Gates, rows: slice) -> torch.Tensor:
        if self.stacked is not None:
            return torch.baddbmm(gates[:, rows], h, self.stacked[0])
        return torch.stack(
            [
                fast_paths.linear(h[d], cell.recurrent_weight, None, block[rows])
                for d, (cell, block) in enumerate(zip(self.cells, gates))
            ]
        )  # (k, active, 4D)

    def projection(self, m: torch.Tensor) -> torch.Tensor:
        if self.stacked is not None:
            return torch.bmm(m, self.stacked[1])
        return torch.stack(
            [fast_paths.linear(m[d], cell.projection_weight) for d, cell in enumerate(self.cells)]
        )  # (k, active, P)

    def compiled_steps(self) -> compiled_steps.CompiledSteps | None:
        return fast_paths.float32_steps(self.cells, self.stacked)


# A cell's `products`: makes the products of a step from the cells and their packed inputs.
MakeProducts = Callable[[Sequence[LstmCell], Sequence[torch.Tensor]], Products]


# ---------------------------------------------------------------------- the step loop
# The input projections are computed for blocks of whole timesteps of at most this many packed
# rows (at least one timestep), not for the whole batch at once: still a large GEMM, and 16 MB
# per direction for the original model, where a batch of 32 sentences of 40 tokens would hold
# 84 MB per direction.
GATE_BLOCK_ROWS = 256


def run_cells(
    cells: Sequence[LstmCell],
    inputs: Sequence[torch.Tensor],
    batch_sizes: list[int],
    states: Sequence[State],
    training: bool,
    products: MakeProducts = Float32Products,
) -> tuple[list[torch.Tensor], list[State]]:
    """Step k cells of the same shape together over packed inputs with the same `batch_sizes`.

    Cell d reads `inputs[d]` (N, in) from `states[d]`; the result is each cell's packed output
    (N, hidden) and final state. `training`: as one autograd node (`fused.py`); else in place,
    with the products that `products` makes.
    """
    first = cells[0]
    cell_clip, proj_clip = first.cell_clip, first.proj_clip
    if training:
        return fused.run_cells(cells, inputs, batch_sizes, states)
    step = products(cells, inputs)
    h = torch.stack([state[0] for state in states])  # (k, rows, hidden)
    c = torch.stack([state[1] for state in states])  # (k, rows, D)
    biases = [cell.bias + cell.forget_bias for cell in cells]
    compiled = getattr(step, "compiled_steps", None)
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
    for index, active in enumerate(batch_sizes):
        if offset == block_end:
            # The input projections of the next block of timesteps, (k, rows, 4D).
            block_start, block_end = offset, _block_end(batch_sizes, index, GATE_BLOCK_ROWS, offset)
            gates_from_input = None  # freed before the next block is allocated
            gates_from_input = step.input_gates([x[block_start:block_end] for x in inputs], biases)
        start = offset - block_start  # this step's rows in the block
        z = step.recurrent_gates(h, gates_from_input, slice(start, start + active))
        c_t, m_t = fast_paths.cell_update(z, c, cell_clip)  # (k, active, D) each, over z
        if first.projection_weight is None:
            h_t = m_t  # TF applies proj_clip only together with the projection
        else:
            h_t = step.projection(m_t)  # (k, active, P)
            if proj_clip is not None:
                h_t = h_t.clamp_(-proj_clip, proj_clip)
        outputs.append(h_t)
        offset += active
        following = batch_sizes[index + 1] if index + 1 < len(batch_sizes) else 0
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


def run_stacks(
    stacks: Sequence[LstmStack],
    inputs: Sequence[torch.Tensor],
    batch_sizes: list[int],
    states: Sequence[list[State]],
    training: bool,
    products: Sequence[MakeProducts] | None = None,
) -> tuple[list[list[torch.Tensor]], list[list[State]]]:
    """Stacks of the same shape over packed inputs, stepped together layer by layer
    (`run_cells`; `products`: those of each layer, float32 where None).

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
        make = products[index] if products is not None else Float32Products
        layer_outputs, layer_finals = run_cells(
            cells, cell_inputs, batch_sizes, layer_states, training, make
        )
        for d, stack in enumerate(stacks):
            output = layer_outputs[d]
            if index > 0 and stack.use_skip_connections:
                # The residual is added to the output, not to h.
                output = output + layer_inputs[d] if training else output.add_(layer_inputs[d])
            outputs[d].append(output)
            final_states[d].append(layer_finals[d])
            layer_inputs[d] = output
    return outputs, final_states
