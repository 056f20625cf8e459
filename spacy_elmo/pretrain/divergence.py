"""Divergence: a run stops where its loss, gradient, weights or held-out perplexity stop being
finite, before such a value reaches a file, and records `DIVERGED` beside the kept checkpoint.
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import torch
from torch import nn

from .config import PretrainConfig
from .objective import MAX_LOG_FLOAT

logger = logging.getLogger("spacy_elmo.pretrain")

DIVERGED = "checkpoints/diverged.json"  # the step, what happened, the rate, the kept step


class TrainingDiverged(ValueError):
    """A non-finite loss, gradient, weight or held-out loss: the run stopped before writing it."""


def step_problem(loss: torch.Tensor, grad_norm: torch.Tensor) -> Optional[str]:
    """The loss and gradient norm in words when either is not finite, or the loss is a mean NLL
    (nats a token) whose perplexity no float holds (guessing uniformly over 50,000 words costs
    about 11 nats); None when both are sound."""
    values = torch.stack([loss.detach().float(), grad_norm.detach().float().to(loss.device)])
    loss_value, norm_value = values.tolist()
    if math.isfinite(loss_value) and math.isfinite(norm_value) and loss_value <= MAX_LOG_FLOAT:
        return None
    return f"the loss is {loss_value:.6g} (nats a token) and the gradient norm {norm_value:.6g}"


def held_out_problem(held_out: dict[str, float]) -> Optional[str]:
    """The held-out perplexity in words when it is not finite; None when it is."""
    if all(math.isfinite(value) for value in held_out.values()):
        return None
    return f"the held-out perplexity is {held_out['dev_ppl']}"


def weights_problem(model: nn.Module, optimizer: torch.optim.Optimizer) -> Optional[str]:
    """The first weight or optimizer moment that is not finite, in words; None if all are."""
    for name, weight in model.named_parameters():
        if not bool(torch.isfinite(weight).all()):
            return f"weight '{name}' holds NaN or inf"
        for key, moment in optimizer.state.get(weight, {}).items():
            finite = not moment.is_floating_point() or bool(torch.isfinite(moment).all())
            if not finite:
                return f"the optimizer's '{key}' of weight '{name}' holds NaN or inf"
    return None


def warn_if_worse_than_guessing(dev_ppl: float, vocab_size: int, config: PretrainConfig) -> None:
    """Warn when the held-out perplexity is over twice the vocabulary's size: worse than
    guessing, so the run has probably diverged."""
    if dev_ppl > 2 * vocab_size:
        logger.warning(
            "the held-out perplexity %.4g is over twice the vocabulary's size (%d): far worse "
            "than guessing every word equally likely; the run has probably diverged "
            "(learning rate %g)",
            dev_ppl,
            vocab_size,
            config.learning_rate,
        )
