"""Tensor files and the one check of every weight: safetensors (no code), `torch.save` files
read with `weights_only`, and the dtype/finiteness check every weight source goes through."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any, Mapping, Union

import numpy
import torch

from ..util.files import atomic_path


def write_safetensors(
    state_dict: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """Write the tensors of `state_dict` (detached, on the CPU) to a safetensors file."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (a format that cannot hold code) that exists;
    ValueError if bad."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"cannot read {path} ({err}); is it truncated?") from None


def read_torch_file(path: Path, what: str) -> Any:
    """A `torch.save` file of plain values and tensors, read with `torch.load(weights_only=True)`
    onto the CPU, which refuses any other object: a crafted file cannot run code.

    ValueError naming `what` and the file when it holds other objects or cannot be read.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"refusing to load {what} {path}: it holds objects other than tensors and plain "
            f"values, which could run code when unpickled; spacy-elmo never loads those "
            f"({_first_line(err)})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"cannot read {what} {path} ({_first_line(err)}); it may be truncated or corrupted"
        ) from None


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else repr(error)


# ---------------------------------------------------------------------- the weights' values
# Every weight source is checked as stored, before the cast to float32: a cast of integers,
# booleans or complex numbers would make numbers of them silently.
WEIGHT_DTYPES = ("float16", "bfloat16", "float32", "float64")
FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)
# What a dtype is, by the start of its name, for the error that refuses it.
DTYPE_KINDS = {
    "complex": "complex",
    "bool": "boolean",
    "int": "integer",
    "uint": "integer",
    "float": "unsupported floating-point",
}

Weights = Union[torch.Tensor, numpy.ndarray]


def check_shapes(
    found: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    source: str,
    described_by: str,
    what: str = "tensor",
) -> None:
    """Raise ValueError naming the first of the `expected` shapes that the tensors (or arrays,
    or hdf5 datasets) of `found` lack or hold in another shape, or the names `found` holds
    beyond `expected`."""
    for name, shape in expected.items():
        if name not in found:
            raise ValueError(f"{source} has no {what} '{name}' required by {described_by}")
        if tuple(found[name].shape) != shape:
            raise ValueError(
                f"{source}: {what} '{name}' has shape {tuple(found[name].shape)} but "
                f"{described_by} implies {shape}"
            )
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        names = ", ".join(unexpected[:5])
        raise ValueError(f"{source} has {what}s that {described_by} does not describe: {names}")


def check_weights(state: Mapping[str, Weights], source: str, what: str = "tensor") -> None:
    """Raise ValueError naming the first tensor (or array) of `state` that is not weights: a
    dtype not in WEIGHT_DTYPES, a NaN or infinity, or a float64 value past float32's range."""
    for key, value in state.items():
        # A numpy dtype by its name: '>f4' (a big-endian file's float32) is float32.
        dtype = value.dtype
        name = dtype.name if isinstance(dtype, numpy.dtype) else str(dtype).removeprefix("torch.")
        if name not in WEIGHT_DTYPES:
            kinds = DTYPE_KINDS.items()
            kind = next((kind for start, kind in kinds if name.startswith(start)), "non-numeric")
            raise ValueError(
                f"{source}: {what} '{key}' has {kind} dtype {name}; ELMo weights are real "
                f"numbers stored as {', '.join(WEIGHT_DTYPES)}"
            )
        if isinstance(value, numpy.ndarray):  # in native byte order (a big-endian file's swapped)
            value = torch.from_numpy(numpy.ascontiguousarray(value, value.dtype.newbyteorder("=")))
        finite = torch.isfinite(value)
        if not finite.all():
            index = int((~finite).flatten().nonzero()[0])
            bad = value.flatten()[index].item()
            position = [int(i) for i in numpy.unravel_index(index, tuple(value.shape))]
            raise ValueError(
                f"{source}: {what} '{key}' contains NaN or inf ({int((~finite).sum()):,} of "
                f"{value.numel():,} values; {bad} at {position})"
            )
        if value.dtype == torch.float64 and value.numel():
            largest = value.abs().max().item()
            if largest > FLOAT32_MAX:
                raise ValueError(
                    f"{source}: {what} '{key}' holds float64 values up to {largest:.3g}, past "
                    f"float32's largest ({FLOAT32_MAX:.3g}): they would become infinite"
                )
