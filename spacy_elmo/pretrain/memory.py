"""Whether a run fits in memory: a generous estimate of training's needs against what the
device has (or `max_memory_gb`), checked before the weights exist."""

from __future__ import annotations

import torch

from ..bilm import BiLMOptions
from .config import PretrainConfig


def estimate_memory_bytes(options: BiLMOptions, vocab_size: int, batch_tokens: int) -> int:
    """A generous estimate of training memory: weights, grads, Adam moments, activations."""
    head_params = options.projection_dim * min(vocab_size, 2 * 10**4) + vocab_size * 64
    params = options.n_parameters() + head_params
    d, p, f = options.lstm_dim, options.projection_dim, options.n_filters
    per_token = 2 * options.n_layers * (9 * d + 4 * p)  # gates, cell, tanh, outputs, grads
    per_token += 50 * f // 2 + 8 * f + 4 * p  # conv maps of distinct tokens, highway
    per_token += 2 * 2 * 2100  # head logits, both directions
    return params * 4 * 4 + batch_tokens * per_token * 4 * 3


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 2**62  # pragma: no cover - non-Linux


def check_memory(config: PretrainConfig, options: BiLMOptions, vocab_size: int, device) -> None:
    need = estimate_memory_bytes(options, vocab_size, config.batch_tokens)
    have = (
        int(config.max_memory_gb * 2**30)
        if config.max_memory_gb is not None
        else available_memory_bytes(device)
    )
    if need > have:
        raise ValueError(
            f"this architecture ({options.n_parameters():,} biLM parameters, D={options.lstm_dim}, "
            f"P={options.projection_dim}) with batch_tokens={config.batch_tokens} needs about "
            f"{need / 2**30:.1f} GiB but only {have / 2**30:.1f} GiB is available; use a smaller "
            f"preset, fewer batch tokens or a bigger machine"
        )
