"""Context-insensitive token layer: char CNN -> highway -> projection (docs/MODEL.md §5)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..description.chars import PADDING_CHAR, PADDING_ROW_ID
from ..description.options import BiLMOptions
from . import fast_paths

CNN_BLOCK_BYTES = 8 << 20  # 40 tokens for the published models' 1024-filter bank
TOP_BLOCK_ROWS = 256


class Highway(nn.Module):
    """x <- t * relu(x W_transform + b_transform) + (1 - t) * x, t = sigmoid(x W_carry + b_carry).

    Both branches share one GEMM: `weight` stacks [W_transform^T; W_carry^T] (always ReLU).
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.empty(2 * width, width))
        self.bias = nn.Parameter(torch.empty(2 * width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        both = F.linear(x, self.weight, self.bias)
        transform, carry = both.chunk(2, dim=-1)  # (n, F) each
        gate = torch.sigmoid(carry)
        return gate * torch.relu(transform) + (1 - gate) * x


class CharCNN(nn.Module):
    """Maps (n, 50) character ids to (n, P) token vectors ((n, 51) with a word id last, for
    ELMoForManyLangs models with a word embedding)."""

    def __init__(self, options: BiLMOptions) -> None:
        super().__init__()
        self.options = options
        self.char_embedding = nn.Embedding(
            options.n_characters, options.char_embedding_dim, padding_idx=PADDING_ROW_ID
        )
        # The id of the padding character after the end of a word (ELMo's 260, shifted; an
        # ELMoForManyLangs model's `<pad>` is set from its dictionary).
        self.padding_id = PADDING_CHAR + 1
        # ELMoForManyLangs: a word embedding, looked up by the last id of each row and
        # concatenated before the CNN features, ahead of the projection.
        self.word_embedding = (
            nn.Embedding(options.n_words, options.word_embedding_dim, padding_idx=PADDING_ROW_ID)
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
        # The convolution outputs (n, filters, positions) are the largest tensors of the biLM:
        # the convolutions run on blocks of tokens so that one filter bank's output stays under
        # CNN_BLOCK_BYTES; the highway and projection GEMMs on blocks of at least
        # TOP_BLOCK_ROWS tokens, where they run at full speed.
        words = None
        if self.word_embedding is not None:  # rows are 50 char ids and a word id
            words = self.word_embedding(char_ids[:, -1])  # (n, word_dim)
            char_ids = char_ids[:, :-1]
        if fast_paths.ENABLED:  # only the columns that decide the max
            widest = max(width for width, _ in self.options.filters)
            char_ids = fast_paths.trim_columns(char_ids, self.padding_id, widest)
        max_filters = max(n_filters for _, n_filters in self.options.filters)
        conv_rows = max(1, CNN_BLOCK_BYTES // (max_filters * char_ids.shape[-1] * 4))
        outputs = []
        start = 0
        for block in char_ids.split(max(conv_rows, TOP_BLOCK_ROWS)):
            features = torch.cat([self._features(part) for part in block.split(conv_rows)])
            for highway in self.highways:
                features = highway(features)
            if words is not None:  # (n, word_dim + F), the word vector first
                features = torch.cat([words[start : start + len(block)], features], dim=-1)
            start += len(block)
            outputs.append(self.projection(features))  # (n, P)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _features(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n, 50) character ids -> (n, F) max-pooled filter activations."""
        chars = self.char_embedding(char_ids)  # (n, 50, e)
        # Max-pool each filter bank over all positions, then the activation (bilm-tf order).
        return torch.cat(
            [self.activation(_conv_max(chars, conv)) for conv in self.convolutions], dim=-1
        )


def _conv_max(chars: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """max over positions of conv(chars): (n, length, e) -> (n, filters)."""
    if chars.device.type == "cpu" and fast_paths.at_inference(chars, conv.weight):
        return fast_paths.conv_max(chars, conv)
    return conv(chars.transpose(1, 2)).amax(dim=-1)
