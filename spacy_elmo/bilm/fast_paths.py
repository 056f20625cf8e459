"""The biLM's fast paths, the one switch that turns them off, and why each is there.

`reference.py` computes ELMo the way docs/MODEL.md writes it (§4-8), and is the oracle of the
tests (tests/bilm/test_reference_model.py). `model.BiLM` takes its route once per call: the
reference's forward pass where `ENABLED` is False (SPACY_ELMO_REFERENCE=1 in the environment
sets it at import) or under `torch.autocast`; else the routes below, the char CNN through
`char_cnn` and the LSTM through `lstm.run_stacks`, fused where autograd records and in place at
inference. Nothing else in the package chooses kernels or memory layouts, or calls private
torch ops.

With `ENABLED` (the default), timed in benchmarks/results/ (kernels_cpu.md for the per-step
products, bilm_cpu.md for inference, pretrain_cpu.md for training):

Training, where autograd records:

* Fused LSTM cells (`fused.py`). Recorded op by op, every timestep of a packed LSTM costs a
  dozen forward and two dozen backward nodes, and every slice of the input gates leaves a
  zero-filled gradient of the whole block to be added up. As one autograd node with a
  hand-written backward pass, a step is only its recurrent products and gate algebra; its
  forward pass is the compiled loop's `step_loop`, run as Python, keeping the activations. Values
  and gradients equal the reference's up to float rounding. Not under `torch.autocast`,
  which needs the ops recorded one by one.
* Trimmed character columns (at inference too). After a token's end-of-word every slot holds
  the padding character, so all windows wholly in the padding give one and the same value:
  convolving up to the longest token plus the widest filter keeps every max, bit for bit, on
  typically half the columns (most tokens are under 15 characters).

Inference, where autograd does not record:

* Token cache: a `BiLM` keeps the char-CNN vectors of the tokens it saw last (`token_cache.py`).
* Channels-last char convolutions, on the CPU: a 2-d convolution of height 1 in the
  channels-last layout, whose output oneDNN writes in place, where `conv1d` writes a blocked
  layout and reorders it into a second buffer of the same size. The same kernel's sums.
* The per-step products, by the size of the kernel:
  - up to STACKED_MAX_ELEMENTS elements (the bundled and small models): one batched GEMM for
    both directions, so that each core runs one direction without waiting for the other. It
    needs a layer's kernels of both directions as one (2, in, out) tensor: `lay_out` stores
    the weights so when a BiLM is built, loaded or copied, each Parameter being a transposed
    view of its slice, so that the batched step reads the weights themselves (no copy, no
    memory; `layers/bilm_wrapper.py` keeps the layout through thinc's optimiser). Where the
    layout is lost (weights moved to another device or dtype, or replaced), each call stacks
    a copy.
  - larger (the medium and original models): oneDNN's inner product, one direction at a time.
    For the few rows of one timestep and a kernel larger than the cache it beats `F.linear`
    (MKL); its fixed cost per call loses on small kernels. It is a private op of torch
    (`torch.ops.mkldnn._linear_pointwise`): SPACY_ELMO_DISABLE_ONEDNN=1 leaves it out, as do
    torch builds without it.
  Both are float32 throughout; only the order of the additions differs from `F.linear`.
* In-place updates: the gates through one sigmoid over all four blocks, and the cell state,
  clipping and residual connections written in place: fewer kernels and allocations per step,
  which is what a batch of one sentence is made of. The input gates of both directions are
  written straight into one (2, rows, 4D) block (`stacked_linear`), not stacked after.
* tanh through the sigmoid, tanh(x) = 2 sigmoid(2x) - 1, for the candidate gate (from the one
  sigmoid over the four blocks) and tanh(c_t), from TANH_VIA_SIGMOID_MIN_ELEMENTS elements on:
  torch's CPU tanh is an accurate SLEEF kernel several times as slow as its sigmoid, and with
  it tanh took more time than the sigmoid and the cell update together. Within 2e-7 of
  torch.tanh; the AllenNLP fixture's outputs stay within 1e-6 of TensorFlow's.
* The step loop in TorchScript (`run_compiled_steps`, float32 with the batched kernels, and
  bfloat16): the same kernels in the same order as `lstm.run_cells`' Python loop, bit for
  bit, as one call that releases the GIL, so that the `elmo` component's `overlap` can run the biLM
  beside the tagger and NER in another thread. SPACY_ELMO_PYTHON_STEPS=1 keeps the Python loop.
* The output written in place: `BiLM.forward` puts every packed output row straight into its
  place in the (L + 1, batch, time, 2P) result, where the autograd route pads each layer and
  direction, reverses the backward ones and concatenates them (four copies of the output,
  most of the memory of a batch).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from . import compiled_steps
from .compiled_steps import CompiledSteps, cell_update_in_place


def _environment_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


# The one switch (see above).
ENABLED = not _environment_flag("SPACY_ELMO_REFERENCE")
ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and not _environment_flag("SPACY_ELMO_DISABLE_ONEDNN")
)
# Per-step kernels of up to this many elements are multiplied for both directions at once (the
# bundled model's (2048, 128) and the small model's (4096, 128) recurrent kernels) ...
STACKED_MAX_ELEMENTS = 1 << 19
# ... and products with kernels of at least this many go to oneDNN (the medium and original
# models' kernels, and the small model's (4096, 128) input kernel).
ONEDNN_MIN_ELEMENTS = 1 << 19


def records_autograd(*tensors: torch.Tensor, modules: Sequence[nn.Module] = ()) -> bool:
    """Whether an op on these tensors (and the parameters of `modules`) would be recorded for
    backward. The parameters are only looked at where autograd is on: listing a biLM's takes
    longer than some of the steps of a one-sentence batch."""
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors) or any(
        p.requires_grad for module in modules for p in module.parameters()
    )


# ---------------------------------------------------------------------- char CNN
# The convolution outputs (n, filters, positions) are the largest tensors of the biLM: the
# convolutions run on blocks of tokens so that one filter bank's output stays under
# CNN_BLOCK_BYTES; the highway and projection GEMMs on blocks of at least TOP_BLOCK_ROWS tokens,
# where they run at full speed.
CNN_BLOCK_BYTES = 8 << 20  # 40 tokens for the published models' 1024-filter bank
TOP_BLOCK_ROWS = 256


def char_cnn(cnn: nn.Module, char_ids: torch.Tensor, padding_id: int) -> torch.Tensor:
    """`reference.CharCNN`'s (n, P) vectors of (n, W) ids, on the columns that decide the max
    (`trim_columns`), in blocks, the convolutions channels-last on the CPU at inference."""
    words = None
    if cnn.word_embedding is not None:  # rows are 50 char ids and a word id
        words = cnn.word_embedding(char_ids[:, -1])  # (n, word_dim)
        char_ids = char_ids[:, :-1]
    widest = max(conv.kernel_size[0] for conv in cnn.convolutions)
    char_ids = trim_columns(char_ids, padding_id, widest)
    max_filters = max(conv.out_channels for conv in cnn.convolutions)
    conv_rows = max(1, CNN_BLOCK_BYTES // (max_filters * char_ids.shape[-1] * 4))
    outputs = []
    start = 0
    for block in char_ids.split(max(conv_rows, TOP_BLOCK_ROWS)):
        features = torch.cat([_features(cnn, part) for part in block.split(conv_rows)])
        for highway in cnn.highways:
            features = highway(features)
        if words is not None:  # (n, word_dim + F), the word vector first
            features = torch.cat([words[start : start + len(block)], features], dim=-1)
        start += len(block)
        outputs.append(cnn.projection(features))  # (n, P)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _features(cnn: nn.Module, char_ids: torch.Tensor) -> torch.Tensor:
    """(n, columns) character ids -> (n, F) max-pooled filter activations."""
    chars = cnn.char_embedding(char_ids)  # (n, columns, e)
    return torch.cat([cnn.activation(_conv_max(chars, conv)) for conv in cnn.convolutions], dim=-1)


def trim_columns(char_ids: torch.Tensor, padding_id: int, widest_filter: int) -> torch.Tensor:
    """The first columns of (n, 50) char ids that decide the max-pooled features: those up to
    the longest token's end, plus the widest filter's (one all-padding window)."""
    padding = char_ids == padding_id
    longest = int((~padding).sum(dim=-1).max()) if char_ids.shape[0] else 0
    keep = longest + widest_filter
    return char_ids[:, :keep] if keep < char_ids.shape[-1] else char_ids


def _conv_max(chars: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """max over positions of conv(chars), (n, length, e) -> (n, filters): on the CPU without
    autograd as a channels-last 2-d convolution of height 1."""
    if chars.device.type != "cpu" or records_autograd(chars, modules=(conv,)):
        return conv(chars.transpose(1, 2)).amax(dim=-1)
    x = chars.transpose(1, 2)[:, :, None, :].contiguous(memory_format=torch.channels_last)
    scores = F.conv2d(x, conv.weight[:, :, None, :], conv.bias)  # (n, filters, 1, positions)
    return scores.amax(dim=(2, 3))


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of (n, 50) char ids and each row's index among them, as
    `torch.unique(rows, dim=0, return_inverse=True)` gives them (up to their order). On the CPU
    through NumPy's unique over each row's bytes: 4x faster than torch's `unique_dim` for a
    batch's 3,300 tokens."""
    if not ENABLED or rows.device.type != "cpu":
        return torch.unique(rows, dim=0, return_inverse=True)
    values = np.ascontiguousarray(rows.numpy())
    keys = values.view(np.dtype((np.void, values.dtype.itemsize * values.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return rows[torch.from_numpy(first)], torch.from_numpy(inverse.reshape(-1))


# ---------------------------------------------------------------------- LSTM products
def uses_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` goes through oneDNN."""
    return (
        ONEDNN
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.numel() >= ONEDNN_MIN_ELEMENTS
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T + bias + add for 2-d `x` (rows, in), `weight` (out, in), `add` (rows, out):
    through oneDNN where it applies, else `F.linear`."""
    if uses_onednn(x, weight):
        # A private op of torch, kept for what it measured (benchmarks/results/kernels_cpu.md,
        # commit 3abb332, both directions, 2 threads): the original model's recurrent step at
        # 32 rows 8,873 us against F.linear's 17,192, its projection at 1 row 177 against 360.
        x = x.contiguous()
        if add is None:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, add.contiguous(), weight, bias, "add")
    y = F.linear(x, weight, bias)
    if add is None:
        return y
    return y.add_(add)


def stacked_linear(
    inputs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
) -> torch.Tensor:
    """(k, rows, out): inputs[d] @ weights[d].T + biases[d] for k products of the same shape,
    without autograd, each written straight into its slice of the result (no stacking copy)."""
    first = inputs[0]
    out = first.new_empty((len(inputs), first.shape[0], weights[0].shape[0]))
    for x, weight, bias, block in zip(inputs, weights, biases, out):
        if uses_onednn(x, weight):
            block.copy_(linear(x, weight, bias))
        else:
            torch.addmm(bias, x, weight.t(), out=block)
    return out


def stacked_kernels(
    cells: Sequence[nn.Module],
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The (k, hidden, 4D) recurrent and (k, D, P) projection kernels of k cells
    (`reference.LstmCell`) for one batched GEMM per step, or None where that step
    does not apply.

    Views of the weights where `lay_out` stored them so, else (in, out) copies.
    """
    recurrent = [cell.recurrent_weight for cell in cells]
    projection = [cell.projection_weight for cell in cells if cell.projection_weight is not None]
    if len(cells) < 2 or recurrent[0].numel() > STACKED_MAX_ELEMENTS:
        return None
    return _as_stack(recurrent), _as_stack(projection) if projection else None


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


def _as_stack(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """(k, in, out) from k (out, in) weights: a view when they are slices of one, else a copy."""
    first = weights[0]
    shape, size = first.t().shape, first.numel()
    if _is_stack(weights):
        return torch.as_strided(
            first, (len(weights), *shape), (size, shape[1], 1), first.storage_offset()
        )
    return torch.stack([w.t() for w in weights])


def lay_out(stacks: Sequence[nn.Module]) -> None:
    """Store each layer's recurrent and projection weights, across the `lstm.LstmStack`s, as one
    (k, in, out) tensor where the batched step applies to them: each Parameter becomes a
    transposed view of its slice (the same Parameter objects, with new memory).

    For weights that no autograd graph or optimiser state refers to by memory: a BiLM that is
    being built, loaded, copied or moved. Weights laid out already keep their memory (so
    `share_memory()` and a `.to()` that changes nothing leave them where they are).
    """
    if not ENABLED:
        return
    for cells in zip(*(stack.layers for stack in stacks)):
        if cells[0].recurrent_weight.numel() > STACKED_MAX_ELEMENTS:
            continue
        for name in ("recurrent_weight", "projection_weight"):
            weights = [getattr(cell, name) for cell in cells]
            if weights[0] is None or _is_stack(weights):  # none, or laid out already
                continue
            with torch.no_grad():
                stacked = torch.stack([weight.detach().t() for weight in weights])
            for weight, kernel in zip(weights, stacked):
                weight.data = kernel.t()


def cell_update(
    z: torch.Tensor, c: torch.Tensor, cell_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LSTM cell update (lstm.py) without autograd, in place over z (..., 4D):
    `compiled_steps.cell_update_in_place`, the one that the compiled step loop runs, with tanh
    through the sigmoid where `tanh_min_elements` says so."""
    return cell_update_in_place(z, c, cell_clip, tanh_min_elements(z))


def tanh_min_elements(x: torch.Tensor) -> int:
    """From how many elements on tanh(x) = 2 sigmoid(2x) - 1 (`tanh`, `cell_update_in_place`)
    for tensors like x: TANH_VIA_SIGMOID_MIN_ELEMENTS on the CPU with the fast paths on."""
    if ENABLED and x.device.type == "cpu":
        return TANH_VIA_SIGMOID_MIN_ELEMENTS
    return NEVER_VIA_SIGMOID


# torch's CPU tanh (SLEEF's accurate kernel) takes 4 to 10 times as long as its sigmoid for the
# same elements: 342 against 86 us for (2, 256, 512) floats on the 2-core AMD EPYC, 2 threads.
# From about this many elements on, tanh(x) = 2 sigmoid(2x) - 1, four cheap kernels, is the
# faster (18.6 against 24.3 us at 16,384; equal near 8,192; tanh wins below, where each kernel's
# fixed cost counts). Within 2e-7 of torch.tanh in float32 (tests/bilm/test_fast_paths.py).
TANH_VIA_SIGMOID_MIN_ELEMENTS = 8192
NEVER_VIA_SIGMOID = 1 << 62


def tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x) as a new tensor, without autograd: through the sigmoid where that is faster."""
    if x.numel() >= tanh_min_elements(x):
        return torch.mul(x, 2).sigmoid_().mul_(2).sub_(1)
    return torch.tanh(x)


# ---------------------------------------------------------------------- the step loop
# SPACY_ELMO_PYTHON_STEPS=1 keeps the Python step loop (the reference of the compiled one).
COMPILED_STEPS = not _environment_flag("SPACY_ELMO_PYTHON_STEPS")


def float32_steps(
    cells: Sequence[nn.Module], stacked: tuple[torch.Tensor, torch.Tensor | None] | None
) -> CompiledSteps | None:
    """The compiled loop's arguments for `lstm.Float32Products` with the batched per-step
    kernels `stacked` of float32 cells on the CPU, or None where the loop does not apply (no
    batched kernels, no projection, or an input product that goes to oneDNN)."""
    if not (ENABLED and COMPILED_STEPS) or stacked is None or stacked[1] is None:
        return None
    recurrent = stacked[0]
    inputs = [cell.input_weight for cell in cells]
    if recurrent.device.type != "cpu" or recurrent.dtype != torch.float32:
        return None
    if ONEDNN and any(w.numel() >= ONEDNN_MIN_ELEMENTS for w in inputs):
        return None
    return CompiledSteps("float32", inputs, recurrent, stacked[1])


def steps_release_gil(bilm: nn.Module) -> bool:
    """Whether a biLM's LSTM steps at inference run in `run_compiled_steps`, without the GIL:
    on the CPU with projections, in bfloat16, or in float32 where the per-step kernels are
    multiplied for both directions at once (the bundled and small models)."""
    cell = bilm.forward_lstm.layers[0]
    weight = cell.recurrent_weight
    if not (ENABLED and COMPILED_STEPS) or cell.projection_weight is None:
        return False
    if weight.device.type != "cpu":
        return False
    if getattr(bilm, "quantize", None) == "bf16":
        return True
    return (
        weight.dtype == torch.float32
        and weight.numel() <= STACKED_MAX_ELEMENTS
        and not (ONEDNN and cell.input_weight.numel() >= ONEDNN_MIN_ELEMENTS)
    )


def run_compiled_steps(
    steps: CompiledSteps,
    inputs: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor],
    h: torch.Tensor,
    c: torch.Tensor,
    batch_sizes: list[int],
    cell_clip: float | None,
    proj_clip: float | None,
    block_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`lstm.run_cells`' loop for k cells stepped together, as one TorchScript call of
    `compiled_steps.step_loop` that releases the GIL: packed output (k, N, P) and final h
    (k, rows, P) and c (k, rows, D)."""
    return compiled_steps.compiled_loop()(
        list(inputs),
        steps.input_kernels,
        list(biases),
        steps.recurrent,
        steps.projection,
        steps.precision,
        h,
        c,
        batch_sizes,
        cell_clip,
        proj_clip,
        block_rows,
        TANH_VIA_SIGMOID_MIN_ELEMENTS,
    )


# ---------------------------------------------------------------------- output
def scatter_layers(
    tokens: torch.Tensor,
    outputs: Sequence[Sequence[torch.Tensor]],
    lengths: torch.Tensor,
    cpu_lengths: torch.Tensor,
    reverse_index: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """`BiLM.forward`'s (L + 1, batch, time, 2P) layers from a run of both LSTM stacks
    (`model.PackedRun`), without autograd: every packed output row copied once, straight into
    its place; zero where `mask` (batch, time) has no token."""
    batch, bounded_time, dim = tokens.shape  # tokens (batch, time + 2, P), boundaries included
    time = bounded_time - 2
    layers = tokens.new_zeros((len(outputs[0]) + 1, batch, time, 2 * dim))
    tokens = tokens[:, 1:-1].masked_fill(~mask[:, :, None], 0.0)
    layers[0, :, :, :dim] = tokens
    layers[0, :, :, dim:] = tokens
    # Where each position of the bounded sentences goes among the batch * time output rows (-1
    # for <S>, </S> and padding); packed like the LSTM inputs, that gives each packed output
    # row its destination.
    position = torch.arange(bounded_time, device=mask.device)[None, :]
    row = torch.arange(batch, device=mask.device)[:, None]
    places = torch.where(
        (position >= 1) & (position <= lengths[:, None]), row * time + position - 1, -1
    )  # (batch, time + 2)
    for half, layer_outputs in enumerate(outputs):
        if half == 1:  # the backward LM ran on the reversed sentences
            places = places.gather(1, reverse_index)
        packed = pack_padded_sequence(places, cpu_lengths, batch_first=True, enforce_sorted=False)
        sources = (packed.data >= 0).nonzero()[:, 0]
        targets = packed.data[sources]
        for index, output in enumerate(layer_outputs):
            rows = layers[index + 1].view(batch * time, 2 * dim)
            rows[:, half * dim : (half + 1) * dim].index_copy_(
                0, targets, output.index_select(0, sources)
            )
    return layers
