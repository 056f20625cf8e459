"""The three matrix products of an LSTM step (input, recurrent, projection), pluggable.

`lstm.run_cells` writes a step once and asks a cell's `products` for its matrix products: in
float32 by default (`Float32Products`, here), in bfloat16 under `quantize.set_quantize`
(`quantize.Bf16Products`). Which kernels run them (one batched GEMM for both directions,
oneDNN, `F.linear`) is decided in `fast_paths.py`; with the fast paths off, each product is
`F.linear`, one cell at a time: the reference.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, Union

import torch
from torch import nn

from . import compiled_steps, fast_paths

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

    def __init__(self, cells: Sequence[nn.Module], inputs: Sequence[torch.Tensor]) -> None:
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
MakeProducts = Callable[[Sequence[nn.Module], Sequence[torch.Tensor]], Products]
