"""bfloat16 inference: the LSTM's matrix products in bfloat16, everything else in float32.

`set_quantize(bilm, "bf16")` switches a biLM to bfloat16 products, in place;
`set_quantize(bilm, None)` switches it back. Its float32 weights stay as they are (the state
dict, saving, export and fine-tuning are unchanged); what changes is how each LSTM cell's
input, recurrent and projection products run where no autograd records: the input rows, the
state h and the cell output m are rounded to bfloat16 and multiplied with bfloat16 kernels
(oneDNN, float32 sums), each product rounded to bfloat16 and added to the rest in float32.
Everything else is float32 and the same code as in float32 (`lstm.py`, `tokens.py`): the char CNN,
the gates, ELMo's cell clip on c_t and projection clip on h_t, the residual connections. The
bfloat16 kernels are made from the float32 weights on first use and again whenever a weight
changes (loading, an optimiser step).

Where it pays: on a CPU with bfloat16 instructions (AVX-512 BF16 or AMX; measured on a 2-core
Intel Xeon, 2026-12-05, benchmarks/results/overlap_cpu.md): the elmo pipeline with the biLM
one batch ahead at 13,205 against 12,285 words/s in float32 (0.78x against 0.73x of the vectors
pipeline), in a process of its own 14,454 against 14,023 (0.86x against 0.83x), at NER F1
within 0.07 of float32 (docs/performance.md, "bfloat16 on the CPU"). Elsewhere oneDNN emulates
bfloat16 and it is slower than float32 (switching it on there warns, `Bf16SpeedWarning`).
Float32 stays the default. tests/bilm/test_quantize.py checks the products against a NumPy
model and bounds the error on the AllenNLP fixture. CPU only.
"""

from __future__ import annotations

import warnings
from typing import Optional, TypeVar

import torch
from torch import nn

from .lstm import Bf16Layer

BiLMModule = TypeVar("BiLMModule", bound=nn.Module)  # a `model.BiLM`

# The settings of `quantize` (the `elmo` component's, `set_quantize`'s): "none" (or None) is
# float32, the default.
QUANTIZE_MODES = ("none", "bf16")


def check_quantize(value: Optional[str], where: str = "quantize") -> Optional[str]:
    """The mode named by `value`: None for float32 (None or "none") or "bf16"; ValueError for
    anything else."""
    if value is None or value == "none":
        return None
    if value == "bf16":
        return value
    raise ValueError(
        f"{where} must be one of {', '.join(repr(m) for m in QUANTIZE_MODES)} or null, "
        f"got {value!r}"
    )


def quantize_from_flags(bf16: bool, gpu: bool, gpu_flag: str) -> Optional[str]:
    """The `quantize` setting of a command's --bf16: "bf16" or None (float32); ValueError for
    --bf16 with a GPU (`gpu_flag` names its option)."""
    if bf16 and gpu:
        raise ValueError(f"--bf16 runs on the CPU only: drop --bf16 or {gpu_flag}")
    return "bf16" if bf16 else None


# ---------------------------------------------------------------------- switching a biLM
def set_quantize(bilm: BiLMModule, mode: Optional[str]) -> BiLMModule:
    """Run the LSTM products of `bilm` (a `model.BiLM`) in bfloat16 ("bf16") or in float32
    (None, "none"), in place; returns the same biLM. Cheap when the mode is already set."""
    mode = check_quantize(mode)
    if mode == quantize_mode(bilm):
        return bilm
    if mode is not None:
        device = bilm.char_cnn.char_embedding.weight.device
        if device.type != "cpu":
            raise ValueError(
                f"quantize={mode!r} runs on the CPU only; this biLM is on {device}: use "
                "float32 on a GPU"
            )
        _warn_if_slow_here()
    bilm.bf16_layers = [Bf16Layer() for _ in range(bilm.options.n_layers)] if mode else None
    bilm.quantize = mode
    return bilm


class Bf16SpeedWarning(RuntimeWarning):
    """bfloat16 was switched on where torch has no fast kernel for its products."""


_warned_slow: set = set()


def _warn_if_slow_here() -> None:
    """Warn once per process where oneDNN has no bfloat16 instructions (AVX-512 BF16 or AMX)
    and emulates them (docs/performance.md, "bfloat16 on the CPU")."""
    if "bf16" in _warned_slow or bf16_is_native():
        return
    _warned_slow.add("bf16")
    warnings.warn(
        "quantize='bf16' on a CPU without bfloat16 instructions (AVX-512 BF16 or AMX): "
        "oneDNN emulates them there, and the biLM runs slower than in float32. Keep float32 "
        "(the default) on this CPU",
        Bf16SpeedWarning,
        stacklevel=3,
    )


def bf16_is_native() -> bool:
    """Whether oneDNN multiplies bfloat16 matrices with the CPU's own instructions here."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


def quantize_mode(bilm: nn.Module) -> Optional[str]:
    """The mode `bilm` runs in: "bf16", or None for float32."""
    return getattr(bilm, "quantize", None)
