"""LSTM with projection and clipping, TF LSTMCell semantics (ELMO_SPEC.md §5.1-5.2).

Each direction of the biLM is a stack of these cells run over packed sequences: one GEMM for
the input projections of all timesteps, then one recurrent GEMM per timestep over the rows
that are still active (rows are sorted by length, so the active rows are a prefix).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# Gate blocks of width D, in the order of the bilm-tf weights: input, candidate, forget, output.
INPUT_GATE, CANDIDATE, FORGET_GATE, OUTPUT_GATE = range(4)
FORGET_BIAS = 1.0  # TF adds this at run time; it is not stored in the weights file

State = tuple[torch.Tensor, torch.Tensor]  # h (rows, P), c (rows, D)


class LstmCellWithProjection(nn.Module):
    """One TF LSTMCell(num_proj, cell_clip, proj_clip, forget_bias=1) over packed sequences."""

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
        h, c = state
        gates_from_input = F.linear(inputs, self.input_weight, self.bias + self.forget_bias)
        outputs = []
        offset = 0
        for active in batch_sizes:
            z = gates_from_input[offset : offset + active] + F.linear(
                h[:active], self.recurrent_weight
            )  # (active, 4D)
            offset += active
            i, j, f, o = z.chunk(4, dim=-1)
            c_t = torch.sigmoid(f) * c[:active] + torch.sigmoid(i) * torch.tanh(j)
            if self.cell_clip is not None:
                c_t = c_t.clamp(-self.cell_clip, self.cell_clip)
            m_t = torch.sigmoid(o) * torch.tanh(c_t)  # (active, D)
            if self.projection_weight is None:
                h_t = m_t  # TF applies proj_clip only together with the projection
            else:
                h_t = F.linear(m_t, self.projection_weight)  # (active, P)
                if self.proj_clip is not None:
                    h_t = h_t.clamp(-self.proj_clip, self.proj_clip)
            outputs.append(h_t)
            # Finished rows keep their final state: they sit after the active prefix.
            if active < h.shape[0]:
                h = torch.cat([h_t, h[active:]])
                c = torch.cat([c_t, c[active:]])
            else:
                h, c = h_t, c_t
        return torch.cat(outputs), (h, c)


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
        outputs, final_states = [], []
        for index, (layer, state) in enumerate(zip(self.layers, states)):
            cell_input = F.dropout(inputs, self.dropout, self.training) if self.dropout else inputs
            layer_output, final_state = layer(cell_input, batch_sizes, state)
            if index > 0 and self.use_skip_connections:
                layer_output = layer_output + inputs  # residual on the output, not on h
            outputs.append(layer_output)
            final_states.append(final_state)
            inputs = layer_output
        return outputs, final_states
