"""bfloat16 inference: the LSTM's matrix products in bfloat16, everything else in float32.

`set_quantize(bilm, "bf16")` switches a biLM's LSTM products at inference to bfloat16 kernels
(oneDNN, float32 sums) made from its float32 weights, which stay as they are (state dict,
saving, fine-tuning); `set_quantize(bilm, None)` switches back. CPU only. It pays on a CPU with
bfloat16 instructions (AVX-512 BF16 or AMX): 1.07x the float32 pipeline at NER F1 within 0.07
(docs/performance.md); elsewhere oneDNN emulates them and it is slower (`Bf16SpeedWarning`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional, TypeVar

import torch
from torch import nn

from .lstm import Bf16Layer

BiLMModule = TypeVar("BiLMModule", bound=nn.Module)  # a `model.BiLM`


def check_quantize(value: Optional[str], where: str = "quantize") -> Optional[str]:
    """The mode named by a `quantize` setting (the `elmo` component's, `set_quantize`'s): None
    for float32, the default (None or "none"), or "bf16"; ValueError for anything else."""
    if value not in (None, "none", "bf16"):
        raise ValueError(f"{where} must be one of 'none', 'bf16' or null, got {value!r}")
    return None if value == "none" else value


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
    if mode == bilm.quantize:
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
    return bilm


class Bf16SpeedWarning(RuntimeWarning):
    """bfloat16 was switched on where torch has no fast kernel for its products."""


@functools.cache
def _warn_if_slow_here() -> None:
    """Warn once per process where oneDNN has no bfloat16 instructions (AVX-512 BF16 or AMX)
    and emulates them (docs/performance.md, "bfloat16 on the CPU")."""
    if bf16_is_native():
        return
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
