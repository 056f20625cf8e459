"""Import shim for AllenNLP 2.10.1 over a CPU-only torch (benchmark venv only).

AllenNLP's import chain imports torchvision. The torchvision 0.28.0 wheel from PyPI is a CUDA
build; against the CPU torch its C++ extension does not load, and `import torchvision` then
fails while registering fake kernels for two ops that nothing defined: `torchvision::nms` and
`torchvision::qnms`. Declaring the two op schemas first makes it import. ELMo never calls them
(they would raise if it did: no kernel is registered).

Where torchvision's extension does load (matching torch builds, e.g. CUDA torch on a GPU
machine) nothing is declared, so torchvision registers its real ops.

Import this module before anything imports allennlp or torchvision.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_LIB = None


def _torchvision_extension_loads() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # no torchvision: nothing to work around
    for folder in spec.submodule_search_locations:
        for library in Path(folder).glob("_C*.so"):
            try:
                torch.ops.load_library(str(library))
            except (OSError, RuntimeError):
                return False
            return True
    return False


def declare_torchvision_ops() -> None:
    global _LIB
    if _LIB is not None or _torchvision_extension_loads():
        return
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB = lib  # keep the registration alive


declare_torchvision_ops()
