"""Both LSTM stacks at speed (docs/MODEL.md §6-7), held against `reference.LstmStack`: packed
rows, both directions stepped together, every layer's outputs written once into the result.

`layer_kernels` chooses each layer's products once per call, by the weights' size and device
and the biLM's `quantize`; `compiled_steps.step_loop` runs the steps: as one TorchScript call
at inference on the CPU, under `fused.py`'s hand-written backward where autograd records. What
each choice measured: docs/research/engine.md.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from . import compiled_steps, fused

State = tuple[torch.Tensor, torch.Tensor]


def environment_flag(name: str) -> bool:
    """Whether the engine's switch `name` is set in the environment (to anything but 0)."""
    return os.environ.get(name, "") not in ("", "0")


ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and not environment_flag("SPACY_ELMO_DISABLE_ONEDNN")
)
# Per-step kernels of up to this many elements (the bundled and small models' recurrent
# kernels) are multiplied for both directions in one batched GEMM per step, one direction per
# core; `lay_out` stores them so that the GEMM reads the weights themselves ...
STACKED_MAX_ELEMENTS = 1 << 19
# ... and products with kernels of at least this many go to oneDNN (`compiled_steps.linear`).
ONEDNN_MIN_ELEMENTS = 1 << 19
# SPACY_ELMO_PYTHON_STEPS=1 runs the step loop as Python at inference, holding the GIL.
COMPILED_STEPS = not environment_flag("SPACY_ELMO_PYTHON_STEPS")
# The input products are made for blocks of whole timesteps of at most this many packed rows
# (at least one timestep): still a large GEMM, in 16 MB per direction for the original model.
GATE_BLOCK_ROWS = 256


# tanh(x) as 2 sigmoid(2x) - 1 from this many elements: 1.3x at 16,384 (docs/research/engine.md)
TANH_VIA_SIGMOID_MIN_ELEMENTS = 8192
NEVER_VIA_SIGMOID = 1 << 62  # off the CPU, where torch's tanh is as fast as its sigmoid


@functools.cache
def compiled_loop():
    """`compiled_steps.step_loop` in TorchScript, compiled on first use (about 0.2 s), or None
    where this torch build cannot compile it (then the loop runs as Python)."""
    # Kept, though deprecated, for releasing the GIL: 1.26x in `nlp.pipe` (docs/research/engine.md)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated")
            return torch.jit.script(compiled_steps.step_loop)
    except RuntimeError:  # a build without oneDNN's op
        return None


# ---------------------------------------------------------------------- the kernels
def uses_onednn(weight: torch.Tensor) -> bool:
    """Whether products with `weight` (float32 rows) go through oneDNN."""
    return (
        ONEDNN
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.numel() >= ONEDNN_MIN_ELEMENTS
    )


def lay_out(stacks: Sequence[nn.Module]) -> None:
    """Store each layer's recurrent and projection weights, across the `reference.LstmStack`s,
    as one (k, in, out) tensor where the batched step applies to them: each Parameter becomes a
    transposed view of its slice (the same Parameter objects, with new memory).

    For weights that no autograd graph or optimiser state refers to by memory: a BiLM that is
    being built, loaded, copied or moved. Weights laid out already keep their memory (so
    `share_memory()` and a `.to()` that changes nothing leave them where they are).
    """
    # Copies of the kernels per call instead: 10% slower at batch 32 (docs/research/engine.md)
    for cells in zip(*(stack.layers for stack in stacks)):
        if cells[0].recurrent_weight.numel() > STACKED_MAX_ELEMENTS:
            continue
        for name in ("recurrent_weight", "projection_weight"):
            weights = [getattr(cell, name) for cell in cells]
            if weights[0] is None or _is_stack(weights):  # none, or laid out already
                continue
            for weight, kernel in zip(weights, as_stack([w.detach() for w in weights])):
                weight.data = kernel.t()


def _is_stack(weights: Sequence[torch.Tensor]) -> bool:
    """Whether k (out, in) weights are the consecutive (in, out) slices of one (k, in, out)
    tensor, as `lay_out` stores them."""
    first = weights[0]
    size = first.numel()
    return all(
        w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        and w.storage_offset() == first.storage_offset() + d * size
        and w.shape == first.shape
        and w.t().is_contiguous()
        for d, w in enumerate(weights)
    )


def as_stack(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """(k, in, out) from k (out, in) weights: a view when they are slices of one, else a copy."""
    first = weights[0]
    shape, size = first.t().shape, first.numel()
    if _is_stack(weights):
        return torch.as_strided(
            first, (len(weights), *shape), (size, shape[1], 1), first.storage_offset()
        )
    return torch.stack([w.t() for w in weights])


class Bf16Kernels:
    """The bfloat16 (in, out) kernels of k (out, in) float32 weights, as one (k, in, out)
    stack; made again when the float32 tensors change (replaced, or written in place: torch's
    private `_version` counts the in-place writes, as for the token cache's key)."""

    def __init__(self) -> None:
        self._cached: tuple = ((), None)  # (key of the float32 tensors, stack)

    def stack(self, weights: Sequence[torch.Tensor]) -> torch.Tensor:
        key = tuple((w.data_ptr(), w._version, w.shape, w.stride()) for w in weights)
        cached_key, stack = self._cached
        if key != cached_key:
            stack = torch.stack([w.detach().t().to(torch.bfloat16) for w in weights])
            self._cached = (key, stack)  # one assignment: threads see the old or the new pair
        return stack

    def __getstate__(self) -> dict:
        """For copy and pickle: without the kernels (made again on first use)."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


class Bf16Layer:
    """The bfloat16 kernels of one layer of both directions (`quantize.set_quantize`)."""

    def __init__(self) -> None:
        self.input = Bf16Kernels()
        self.recurrent = Bf16Kernels()
        self.projection = Bf16Kernels()


class LayerKernels(NamedTuple):
    """The arguments of `compiled_steps.step_loop` that say how a layer's products run."""

    mode: str  # "batched", "single" or "bfloat16"
    onednn: List[bool]  # for the input, recurrent and projection products
    input_kernels: List[torch.Tensor]
    recurrent: List[torch.Tensor]
    projection: List[torch.Tensor]  # empty without a projection


def layer_kernels(cells: Sequence[nn.Module], bf16: Optional[Bf16Layer] = None) -> LayerKernels:
    """How the products of k cells (`reference.LstmCell`) stepped together run: in bfloat16
    where `bf16` holds the layer's kernels, else one batched GEMM for all k per step where the
    kernels are small, else one product per cell, through oneDNN where it applies."""
    first = cells[0]
    names = ("input_weight", "recurrent_weight", "projection_weight")
    weights = {name: [getattr(cell, name) for cell in cells] for name in names}
    has_projection = first.projection_weight is not None
    if bf16 is not None:
        projection = [bf16.projection.stack(weights["projection_weight"])] if has_projection else []
        return LayerKernels(
            "bfloat16",
            [False, False, False],
            list(bf16.input.stack(weights["input_weight"])),
            [bf16.recurrent.stack(weights["recurrent_weight"])],
            projection,
        )
    onednn = [uses_onednn(first.input_weight), uses_onednn(first.recurrent_weight)]
    onednn.append(has_projection and uses_onednn(first.projection_weight))
    if len(cells) > 1 and first.recurrent_weight.numel() <= STACKED_MAX_ELEMENTS:
        projection = [as_stack(weights["projection_weight"])] if has_projection else []
        recurrent = [as_stack(weights["recurrent_weight"])]
        return LayerKernels("batched", onednn, weights["input_weight"], recurrent, projection)
    projection = weights["projection_weight"] if has_projection else []
    return LayerKernels(
        "single", onednn, weights["input_weight"], weights["recurrent_weight"], projection
    )


def compiled_loop_applies(weight: torch.Tensor) -> bool:
    """Whether the step loop of a biLM with this weight runs as one TorchScript call that
    releases the GIL at inference (on the CPU, unless SPACY_ELMO_PYTHON_STEPS=1)."""
    return COMPILED_STEPS and weight.device.type == "cpu" and compiled_loop() is not None


# ---------------------------------------------------------------------- the run
@dataclass
class PackedRun:
    """What one run of both LSTM stacks leaves, in the packed (length-sorted) layout."""

    tokens: torch.Tensor  # (batch, time + 2, P) token vectors with <S>/</S>
    outputs: list[list[torch.Tensor]]  # per direction, per layer: packed (N, P)
    final_states: list[list[State]]  # per direction, per layer, rows in the packed order
    packing: PackedSequence  # of the forward inputs: batch sizes and (un)sorted indices
    lengths: torch.Tensor  # (batch,) tokens per sentence, boundaries excluded
    cpu_lengths: torch.Tensor  # (batch,) lengths + 2 on the CPU, for packing
    mask: torch.Tensor  # (batch, time + 2)
    reverse_index: torch.Tensor  # (batch, time + 2): the backward LM's input positions


def run(
    stacks: Sequence[nn.Module],
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    states: Sequence[list[State]],
    training: bool,
    bf16: Optional[List[Bf16Layer]] = None,
) -> PackedRun:
    """Both stacks (forward, backward) over token vectors (batch, time + 2, P) with `<S>` and
    `</S>`; `lengths` (batch,) counts the tokens without them. `states`: each direction's
    initial (h, c) per layer, one row per sentence."""
    batch, bounded_time, _ = tokens.shape
    positions = torch.arange(bounded_time, device=tokens.device)
    bounded_lengths = lengths + 2
    mask = positions[None, :] < bounded_lengths[:, None]  # (batch, time + 2)
    # The backward LM reads each sentence from </S> to <S>: reverse within its length.
    reverse_index = torch.where(
        mask, bounded_lengths[:, None] - 1 - positions[None, :], positions[None, :]
    )
    cpu_lengths = bounded_lengths.cpu()
    packed = [
        pack_padded_sequence(inputs, cpu_lengths, batch_first=True, enforce_sorted=False)
        for inputs in (tokens, _gather_time(tokens, reverse_index))
    ]  # forward and backward inputs, each packed (N, P), N = sum of bounded_lengths
    order = packed[0].sorted_indices
    sorted_states = [[(h[order], c[order]) for h, c in direction] for direction in states]
    outputs, final_states = run_stacks(
        stacks,
        [p.data for p in packed],
        packed[0].batch_sizes.tolist(),
        sorted_states,
        training,
        bf16,
    )
    return PackedRun(
        tokens, outputs, final_states, packed[0], lengths, cpu_lengths, mask, reverse_index
    )


def run_stacks(
    stacks: Sequence[nn.Module],
    inputs: Sequence[torch.Tensor],
    batch_sizes: list[int],
    states: Sequence[list[State]],
    training: bool,
    bf16: Optional[List[Bf16Layer]] = None,
) -> tuple[list[list[torch.Tensor]], list[list[State]]]:
    """Stacks of the same shape over packed inputs (N, in) with the same `batch_sizes`,
    stepped together layer by layer: per stack, the packed output of every layer and the final
    state of every layer. `training`: each layer as one autograd node (`fused.py`); else in
    place, with the kernels `layer_kernels` chooses (bfloat16 where `bf16` is given)."""
    loop = compiled_steps.step_loop
    if not training and compiled_loop_applies(inputs[0]):
        loop = compiled_loop()
    tanh_min = NEVER_VIA_SIGMOID
    if inputs[0].device.type == "cpu":
        tanh_min = TANH_VIA_SIGMOID_MIN_ELEMENTS
    outputs: list[list[torch.Tensor]] = [[] for _ in stacks]
    final_states: list[list[State]] = [[] for _ in stacks]
    layer_inputs = list(inputs)
    for index in range(len(stacks[0].layers)):
        cells = [stack.layers[index] for stack in stacks]
        cell_inputs = [
            F.dropout(x, stack.dropout, stack.training) if stack.dropout else x
            for stack, x in zip(stacks, layer_inputs)
        ]
        layer_states = [stack_states[index] for stack_states in states]
        if training:
            packed, final_h, final_c = fused.run_cells(
                cells, cell_inputs, batch_sizes, layer_states, tanh_min
            )
        else:
            kernels = layer_kernels(cells, bf16[index] if bf16 is not None else None)
            packed, final_h, final_c = loop(
                cell_inputs,
                kernels.input_kernels,
                [cell.bias + cell.forget_bias for cell in cells],
                kernels.recurrent,
                kernels.projection,
                kernels.mode,
                kernels.onednn,
                torch.stack([state[0] for state in layer_states]),  # (k, rows, hidden)
                torch.stack([state[1] for state in layer_states]),  # (k, rows, D)
                batch_sizes,
                cells[0].cell_clip,
                cells[0].proj_clip,
                GATE_BLOCK_ROWS,
                tanh_min,
            )
        for d, stack in enumerate(stacks):
            output = packed[d]
            if index > 0 and stack.use_skip_connections:
                # The residual is added to the output, not to h.
                output = output + layer_inputs[d] if training else output.add_(layer_inputs[d])
            outputs[d].append(output)
            final_states[d].append((final_h[d], final_c[d]))
            layer_inputs[d] = output
    return outputs, final_states


# ---------------------------------------------------------------------- the outputs
def scatter_layers(run: PackedRun) -> torch.Tensor:
    """The (L + 1, batch, time, 2P) layers of a run at inference, boundaries removed and zero
    where no token is: every packed output row copied once, straight into its place."""
    tokens = run.tokens  # (batch, time + 2, P), boundaries included
    batch, bounded_time, dim = tokens.shape
    time = bounded_time - 2
    mask = run.mask[:, 2:]  # (batch, time): True where a token is
    layers = tokens.new_zeros((len(run.outputs[0]) + 1, batch, time, 2 * dim))
    tokens = tokens[:, 1:-1].masked_fill(~mask[:, :, None], 0.0)
    layers[0, :, :, :dim] = tokens
    layers[0, :, :, dim:] = tokens
    # Where each position of the bounded sentences goes among the batch * time output rows (-1
    # for <S>, </S> and padding); packed like the LSTM inputs, that gives each packed output
    # row its destination.
    position = torch.arange(bounded_time, device=mask.device)[None, :]
    row = torch.arange(batch, device=mask.device)[:, None]
    places = torch.where(
        (position >= 1) & (position <= run.lengths[:, None]), row * time + position - 1, -1
    )  # (batch, time + 2)
    for half, layer_outputs in enumerate(run.outputs):
        if half == 1:  # the backward LM ran on the reversed sentences
            places = places.gather(1, run.reverse_index)
        packed = pack_padded_sequence(
            places, run.cpu_lengths, batch_first=True, enforce_sorted=False
        )
        sources = (packed.data >= 0).nonzero()[:, 0]
        targets = packed.data[sources]
        for index, output in enumerate(layer_outputs):
            rows = layers[index + 1].view(batch * time, 2 * dim)
            rows[:, half * dim : (half + 1) * dim].index_copy_(
                0, targets, output.index_select(0, sources)
            )
    return layers


def padded_outputs(run: PackedRun) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each layer's forward and backward outputs (batch, time + 2, P), padded, the backward
    ones in the original word order (with autograd: what language-model training reads)."""
    time = run.tokens.shape[1]
    directions = []
    for direction, layer_outputs in enumerate(run.outputs):
        padded = [
            pad_packed_sequence(
                run.packing._replace(data=output), batch_first=True, total_length=time
            )[0]
            for output in layer_outputs
        ]  # L x (batch, time + 2, P), packed as the forward inputs were
        if direction == 1:
            padded = [_gather_time(output, run.reverse_index) for output in padded]
        directions.append(padded)
    return directions[0], directions[1]


def _gather_time(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b, t]] for (batch, time, dim) values and (batch, time) index."""
    return values.gather(1, index[:, :, None].expand(-1, -1, values.shape[-1]))
