"""Import shim for AllenNLP 2.10.1 over a CPU-only torch (benchmark venv only).

AllenNLP's import chain imports torchvision. The torchvision 0.28.0 wheel from PyPI is a CUDA
build, and against the CPU torch it fails while registering fake kernels for two ops its C++
library did not define: `torchvision::nms` and `torchvision::qnms`. Declaring the two op schemas
first makes it import. ELMo never calls them (they would raise if it did: no kernel is registered).

Import this module before anything imports allennlp or torchvision.
"""

from __future__ import annotations

import torch

_LIB = None


def declare_torchvision_ops() -> None:
    global _LIB
    if _LIB is not None:
        return
    try:
        torch.ops.torchvision.nms  # noqa: B018  (already defined: a working torchvision build)
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB = lib  # keep the registration alive


declare_torchvision_ops()
