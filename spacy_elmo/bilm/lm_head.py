"""Softmax over the word vocabulary for language-model training: adaptive when it is large."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

DEFAULT_CUTOFFS = (2000, 10000)


class LMHead(nn.Module):
    """Shared by the forward and backward LMs (as in bilm-tf); returns summed NLL.

    With a vocabulary larger than the first cutoff it is an adaptive softmax (Grave et al.,
    2017): exact probabilities, so perplexities are exact too, at a fraction of the cost.
    """

    def __init__(self, dim: int, vocab_size: int, cutoffs: tuple[int, ...] = DEFAULT_CUTOFFS):
        super().__init__()
        self.vocab_size = vocab_size
        self.cutoffs = tuple(c for c in cutoffs if c < vocab_size - 1)
        if self.cutoffs:
            self.softmax = nn.AdaptiveLogSoftmaxWithLoss(
                dim, vocab_size, list(self.cutoffs), div_value=4.0
            )
        else:
            self.softmax = nn.Linear(dim, vocab_size)

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed negative log-likelihood of (n,) targets given (n, dim) hidden states."""
        if targets.numel() == 0:
            return hidden.sum() * 0.0
        if self.cutoffs:
            return self.softmax(hidden, targets).loss * targets.numel()
        return F.cross_entropy(self.softmax(hidden), targets, reduction="sum")
