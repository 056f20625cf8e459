"""The matrix products of the biLM, routed to the fastest exact float32 kernel.

At inference on the CPU, oneDNN's inner product runs the per-step LSTM products about twice as
fast as `F.linear` (MKL) for the few rows of one timestep and a kernel larger than the cache:
on 2 cores, the original model's (16384, 512) recurrent kernel takes 4.4 ms against 8.6 ms per
direction for 32 rows, 1.3 ms against 3.1 ms for one row (`benchmarks/bench_kernels.py`). Its
fixed cost per call (about 15 us) loses on small kernels, so those stay with `F.linear`. Both
are float32 throughout; only the order of the additions differs.

With autograd (training, fine-tuning), on other devices and in other dtypes this is `F.linear`.
"""

from __future__ import annotations

import os

import torch
from torch.nn import functional as F

# Kernels with fewer elements than this stay with F.linear at inference (the (4D, P) kernels of
# the bundled model, 2048 x 128, are below; the published models' kernels are above).
ONEDNN_MIN_ELEMENTS = 1 << 19

_ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and os.environ.get("SPACY_ELMO_DISABLE_ONEDNN", "") in ("", "0")
)


def records_autograd(*tensors: torch.Tensor) -> bool:
    """Whether an op on these tensors would be recorded for backward."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def weights_key(weights) -> tuple:
    """Changes whenever one of the tensors is replaced or modified in place (cache keys)."""
    return tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)


def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` goes through oneDNN."""
    return (
        _ONEDNN
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.numel() >= ONEDNN_MIN_ELEMENTS
        and not records_autograd(x, weight)
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T + bias + add for 2-d `x` (rows, in), `weight` (out, in), `add` (rows, out)."""
    if uses_onednn(x, weight):
        x = x.contiguous()
        if add is None:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, add.contiguous(), weight, bias, "add")
    y = F.linear(x, weight, bias)
    if add is None:
        return y
    return y + add if y.requires_grad else y.add_(add)
