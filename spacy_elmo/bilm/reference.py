"""The ELMo biLM written once, plainly: the oracle that every fast route is held against.

Read top to bottom against docs/MODEL.md §4-8: the character ids, the char CNN, the LSTM cell
with projection and both clips, the two stacks and what the biLM returns. Every product is
`F.linear` or `conv1d`, one direction and one timestep at a time, over padded sentences; no
speed switch. Parameters are named as `model.BiLM`'s, so either loads the other's state dict.
Imports torch and the standard library only (`options`: any object with BiLMOptions' fields).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

State = tuple[torch.Tensor, torch.Tensor]  # h (batch, hidden), c (batch, D)
FORGET_BIAS = 1.0  # TF adds it to the forget gate at run time; the weights file lacks it


# ---------------------------------------------------------------------- §4 character ids
# Bytes 0-255 are a token's UTF-8 bytes; then begin and end of sentence, begin and end of word,
# and the padding after a word's end. Every id is shifted by one: a row of 0 is "no token".
BOS, EOS, BOW, EOW, PAD = 256, 257, 258, 259, 260
WIDTH = 50  # ids per token: at most 48 bytes between begin and end of word


def token_ids(token: str) -> list[int]:
    """The 50 shifted ids of one token; "<S>" and "</S>" are the sentence boundaries (§4)."""
    specials = {"<S>": [BOS], "</S>": [EOS]}
    raw = specials.get(token) or list(token.encode("utf-8", errors="ignore")[: WIDTH - 2])
    row = [BOW, *raw, EOW] + [PAD] * (WIDTH - 2 - len(raw))
    return [i + 1 for i in row]


BOS_IDS, EOS_IDS = tuple(token_ids("<S>")), tuple(token_ids("</S>"))


def add_boundaries(
    char_ids: torch.Tensor, bos_ids: tuple[int, ...], eos_ids: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, time, W) ids -> (batch, time + 2, W) with `<S>` at 0 and `</S>` right after each
    sentence's last token, and the (batch,) lengths with both boundaries (§4)."""
    batch, time, width = char_ids.shape
    lengths = (char_ids > 0).any(dim=-1).sum(dim=1)  # (batch,) tokens per sentence
    bounded = char_ids.new_zeros((batch, time + 2, width))
    bounded[:, 1 : time + 1] = char_ids
    device = char_ids.device
    bounded[:, 0] = torch.tensor(bos_ids, device=device)
    bounded[torch.arange(batch, device=device), lengths + 1] = torch.tensor(eos_ids, device=device)
    return bounded, lengths + 2


# ---------------------------------------------------------------------- §5 the token layer
class Highway(nn.Module):
    """x <- t * relu(x W_transform + b_transform) + (1 - t) * x, t = sigmoid(x W_carry + b_carry);
    `weight` stacks W_transform^T over W_carry^T (2F, F) (§5, step 5)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(2 * width, width))
        self.bias = nn.Parameter(torch.empty(2 * width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        transform, carry = F.linear(x, self.weight, self.bias).chunk(2, dim=-1)  # (n, F) each
        gate = torch.sigmoid(carry)
        return gate * torch.relu(transform) + (1 - gate) * x


class CharCNN(nn.Module):
    """(n, 50) char ids -> (n, P) token vectors; (n, 51) with a word id last for an
    ELMoForManyLangs model with a word embedding (§5, §12)."""

    def __init__(self, options) -> None:
        super().__init__()
        self.projection_dim = options.projection_dim
        self.char_embedding = nn.Embedding(
            options.n_characters, options.char_embedding_dim, padding_idx=0
        )
        self.word_embedding = (
            nn.Embedding(options.n_words, options.word_embedding_dim, padding_idx=0)
            if options.word_embedding_dim
            else None
        )
        self.convolutions = nn.ModuleList(
            nn.Conv1d(options.char_embedding_dim, n_filters, width)
            for width, n_filters in options.filters
        )
        self.activation = torch.relu if options.activation == "relu" else torch.tanh
        self.highways = nn.ModuleList(Highway(options.n_filters) for _ in range(options.n_highway))
        self.projection = (
            nn.Linear(options.word_embedding_dim + options.n_filters, options.projection_dim)
            if options.has_char_projection
            else nn.Identity()
        )

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        words = None
        if self.word_embedding is not None:
            words = self.word_embedding(char_ids[:, -1])  # (n, word_dim)
            char_ids = char_ids[:, :-1]
        chars = self.char_embedding(char_ids).transpose(1, 2)  # (n, e, 50)
        # Max over all positions, then the activation (bilm-tf's order).
        features = torch.cat(
            [self.activation(conv(chars).amax(dim=-1)) for conv in self.convolutions], dim=-1
        )  # (n, F)
        for highway in self.highways:
            features = highway(features)
        if words is not None:
            features = torch.cat([words, features], dim=-1)  # (n, word_dim + F)
        return self.projection(features)  # (n, P)


def token_vectors(char_cnn: CharCNN, char_ids: torch.Tensor) -> torch.Tensor:
    """(batch, time, P) vectors of (batch, time, W) ids; zero where no token is (§5)."""
    mask = (char_ids > 0).any(dim=-1)  # (batch, time)
    vectors = char_cnn(char_ids.reshape(-1, char_ids.shape[-1]))
    return vectors.view(*mask.shape, -1) * mask[..., None]


# ---------------------------------------------------------------------- §6.1 the LSTM cell
class LstmCell(nn.Module):
    """TF's LSTMCell(num_proj=P, cell_clip, proj_clip, forget_bias=1); gate blocks i, j, f, o
    (§6.1)."""

    def __init__(
        self,
        input_dim: int,
        cell_dim: int,
        projection_dim: int,
        cell_clip: float | None,
        proj_clip: float | None,
        use_projection: bool,
    ) -> None:
        super().__init__()
        self.cell_dim = cell_dim
        self.hidden_dim = projection_dim if use_projection else cell_dim
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.input_weight = nn.Parameter(torch.empty(4 * cell_dim, input_dim))
        self.recurrent_weight = nn.Parameter(torch.empty(4 * cell_dim, self.hidden_dim))
        self.bias = nn.Parameter(torch.empty(4 * cell_dim))  # without the forget bias
        self.projection_weight = (
            nn.Parameter(torch.empty(projection_dim, cell_dim)) if use_projection else None
        )
        forget = torch.zeros(4 * cell_dim)
        forget[2 * cell_dim : 3 * cell_dim] = FORGET_BIAS  # on the f block
        self.register_buffer("forget_bias", forget, persistent=False)

    def forward(self, x: torch.Tensor, state: State) -> State:
        """One step: x (batch, in), state (h, c) -> the new (h, c)."""
        h, c = state
        bias = self.bias + self.forget_bias
        z = F.linear(x, self.input_weight, bias) + F.linear(h, self.recurrent_weight)
        i, j, f, o = z.chunk(4, dim=-1)  # (batch, D) each
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
        if self.cell_clip is not None:
            c = c.clamp(-self.cell_clip, self.cell_clip)
        m = torch.sigmoid(o) * torch.tanh(c)
        if self.projection_weight is None:
            return m, c  # TF clips only a projected output
        h = F.linear(m, self.projection_weight)  # (batch, P)
        if self.proj_clip is not None:
            h = h.clamp(-self.proj_clip, self.proj_clip)
        return h, c


# ---------------------------------------------------------------------- §6.2 the stacks
class LstmStack(nn.Module):
    """L cells of one direction; from the second on, the cell's input is added to its output
    (§6.2)."""

    def __init__(self, options) -> None:
        super().__init__()
        self.use_skip_connections = options.use_skip_connections
        self.dropout = 0.0  # on each cell's input, in training mode only (LM pretraining)
        dim = options.projection_dim
        self.layers = nn.ModuleList(
            LstmCell(
                dim,
                options.lstm_dim,
                dim,
                options.cell_clip,
                options.proj_clip,
                options.has_lstm_projection,
            )
            for _ in range(options.n_layers)
        )

    def forward(
        self, inputs: torch.Tensor, lengths: torch.Tensor, states: list[State] | None = None
    ) -> tuple[list[torch.Tensor], list[State]]:
        """Padded inputs (batch, time, P), each row running over its first `lengths` steps ->
        every cell's outputs (batch, time, P), zero past a row's length, and final states."""
        batch, time, _ = inputs.shape
        active = (
            torch.arange(time, device=inputs.device)[None, :] < lengths[:, None]
        )  # (batch, time)
        outputs, finals = [], []
        for index, cell in enumerate(self.layers):
            if states is None:
                h = inputs.new_zeros((batch, cell.hidden_dim))
                c = inputs.new_zeros((batch, cell.cell_dim))
            else:
                h, c = states[index]
            x = F.dropout(inputs, self.dropout, self.training) if self.dropout else inputs
            steps = []
            for t in range(time):
                new_h, new_c = cell(x[:, t], (h, c))
                keep = active[:, t, None]  # rows past their end keep their state
                h, c = torch.where(keep, new_h, h), torch.where(keep, new_c, c)
                steps.append(new_h * keep)
            output = torch.stack(steps, dim=1)  # (batch, time, hidden)
            if index > 0 and self.use_skip_connections:
                output = output + inputs * active[..., None]
            outputs.append(output)
            finals.append((h, c))
            inputs = output
        return outputs, finals


def reverse_within(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(batch, time, dim) with each row's first `lengths` steps in reverse order: the backward
    LM's input, and its outputs put back (§6.2)."""
    positions = torch.arange(values.shape[1], device=values.device)[None, :]
    index = torch.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)
    return values.gather(1, index[..., None].expand_as(values))


# ---------------------------------------------------------------------- §7 the biLM
class ReferenceBiLM(nn.Module):
    """ELMo's biLM on (batch, time, W) char ids without boundaries (§7, §8)."""

    def __init__(self, options) -> None:
        super().__init__()
        self.options = options
        self.char_cnn = CharCNN(options)
        self.forward_lstm = LstmStack(options)
        self.backward_lstm = LstmStack(options)

    @classmethod
    def of(cls, bilm: nn.Module) -> ReferenceBiLM:
        """A reference biLM with the weights of `bilm` (a `model.BiLM`)."""
        reference = cls(bilm.options)
        reference.load_state_dict(bilm.state_dict())
        return reference

    def forward(self, char_ids, states=None, boundaries=(BOS_IDS, EOS_IDS)):
        """What the biLM returns (§7): the (L + 1, batch, time, 2P) layers, zero where no token
        is, and the final states of both directions (§8; `run`'s arguments)."""
        tokens, forward, backward, lengths, finals = run(self, char_ids, states, boundaries)
        return stack_layers(tokens, forward, backward, lengths - 2), finals


def run(
    bilm: nn.Module,
    char_ids: torch.Tensor,
    states: tuple[list[State], list[State]] | None = None,
    boundaries: tuple[tuple[int, ...], tuple[int, ...]] = (BOS_IDS, EOS_IDS),
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor, tuple]:
    """The biLM's activations (§7) for (batch, time, W) ids, with `<S>` and `</S>` added
    (`boundaries`: their id rows): the token vectors (batch, time + 2, P), each cell's forward
    and backward outputs (batch, time + 2, P; the backward ones in the original order), the
    lengths with the boundaries (batch,) and the final states of both directions. `bilm` is
    any module with a `char_cnn`, a `forward_lstm` and a `backward_lstm`. `states` (§8): each
    direction's initial (h, c) per cell, one row per sentence; zeros where None."""
    bounded, lengths = add_boundaries(char_ids, *boundaries)  # (batch, time + 2, W)
    tokens = token_vectors(bilm.char_cnn, bounded)  # (batch, time + 2, P)
    forward_states, backward_states = states if states is not None else (None, None)
    forward, forward_finals = bilm.forward_lstm(tokens, lengths, forward_states)
    backward, backward_finals = bilm.backward_lstm(
        reverse_within(tokens, lengths), lengths, backward_states
    )
    backward = [reverse_within(output, lengths) for output in backward]
    return tokens, forward, backward, lengths, (forward_finals, backward_finals)


def stack_layers(
    tokens: torch.Tensor,
    forward: list[torch.Tensor],
    backward: list[torch.Tensor],
    lengths: torch.Tensor,
) -> torch.Tensor:
    """The (L + 1, batch, time, 2P) layers of `run`'s outputs (batch, time + 2, P): the token
    vectors twice, then each cell's forward and backward outputs side by side; boundaries
    removed, zero past each sentence's `lengths` tokens (§7)."""
    time = tokens.shape[1] - 2
    outputs = [torch.cat([tokens, tokens], dim=-1)]
    outputs += [torch.cat(pair, dim=-1) for pair in zip(forward, backward)]
    mask = torch.arange(time, device=lengths.device)[None, :] < lengths[:, None]
    stacked = torch.stack(outputs)[:, :, 1 : time + 1]  # boundaries removed
    return stacked * mask[None, :, :, None]
