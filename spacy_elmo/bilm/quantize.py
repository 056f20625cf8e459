"""int8 inference: the biLM's matrix products in int8, everything else as in float32.

`quantize_int8(bilm)` switches a biLM to dynamic int8 quantisation, in place;
`set_quantize(bilm, None)` switches it back. Its float32 weights stay as they are (the state
dict, saving, export and fine-tuning are unchanged); what changes is how the products run
where no autograd records:

* the char CNN's highway layers and its projection to P;
* each LSTM cell's input product (all timesteps of a block at once), its recurrent product
  and its projection (one timestep at a time).

Each weight matrix W (out, in) is quantised to int8 with one scale per output row,
s_o = max_i |W_oi| / 127, and each row r of the input x (a token, or a sentence's state at a
timestep) when it is multiplied, with its own scale t_r = max_i |x_ri| / 127 (symmetric,
round to nearest). The product of the int8 values is exact in int32 (`torch._int_mm`), then
y_ro = t_r s_o sum_i q(x)_ri q(W)_oi + b_o in float32. With one scale per input row, a
sentence's vectors do not depend on the other sentences of its batch, as in float32 (PyTorch's
`quantize_dynamic` takes one scale for the whole input, so they would).

Everything else is float32 and the same code as `lstm.py` and `char_cnn.py`: the character
embedding and convolutions, the gates' nonlinearities, ELMo's cell clip on c_t and projection
clip on h_t (applied to the float32 results of the int8 products, so they hold exactly), the
residual connections, and the outputs. The LSTM cells run `lstm.run_cells`' own step loop
with int8 products (`Int8Cell`, a cell's `products`). The int8 weights are made from the
float32 ones on first use and again whenever a weight changes (loading, an optimiser step).

The errors against float32 and the speed are measured in docs/performance.md ("int8 on the
CPU"); tests/bilm/test_quantize.py checks the product against a NumPy model of the scheme and
bounds the error on the AllenNLP fixture. CPU only.
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence, TypeVar

import torch
from torch import nn

from . import fast_paths
from .lstm import Float32Products, LstmCellWithProjection, Products

BiLMModule = TypeVar("BiLMModule", bound=nn.Module)  # a `model.BiLM`

# The settings of `quantize` (the `elmo` component's, `set_quantize`'s): "none" (or None) is
# float32, the default.
QUANTIZE_MODES = ("none", "int8", "bf16")
INT8_MAX = 127  # symmetric: -127 .. 127
TINY_SCALE = 1e-12  # the scale of an all-zero row (any positive value gives zeros)


def check_quantize(value: Optional[str], where: str = "quantize") -> Optional[str]:
    """The mode named by `value`: None for float32 (None or "none"), "int8" or "bf16";
    ValueError for anything else."""
    if value is None or value == "none":
        return None
    if value in ("int8", "bf16"):
        return value
    raise ValueError(
        f"{where} must be one of {', '.join(repr(m) for m in QUANTIZE_MODES)} or null, "
        f"got {value!r}"
    )


def quantize_from_flags(int8: bool, bf16: bool, gpu: bool, gpu_flag: str) -> Optional[str]:
    """The `quantize` setting of a command's --int8 / --bf16: "int8", "bf16" or None
    (float32); ValueError for both, or for either with a GPU (`gpu_flag` names its option)."""
    if int8 and bf16:
        raise ValueError("choose at most one of --int8 and --bf16")
    mode = "int8" if int8 else "bf16" if bf16 else None
    if mode is not None and gpu:
        raise ValueError(f"--{mode} runs on the CPU only: drop --{mode} or {gpu_flag}")
    return mode


class Int8Weight:
    """A weight (out, in) in int8: `kernel` (in, out) int8 and `scale` (out,) float32, with
    the float32 `bias` (out,) or None."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        if weight.device.type != "cpu":
            raise ValueError(
                f"int8 quantisation runs on the CPU only; this biLM's weights are on "
                f"{weight.device}: move it to the CPU, or use float32"
            )
        values, scale = quantize_rows(weight.detach().to(torch.float32))
        self.scale = scale[:, 0]  # (out,)
        self.kernel = values.t().contiguous()  # (in, out)
        self.bias = None if bias is None else bias.detach().to(torch.float32).clone()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., n) float32 -> int8 values (..., n) and one scale per row (..., 1):
    x ~ values * scale, scale = max |row| / 127."""
    scale = x.abs().amax(dim=-1, keepdim=True)  # the inf-norm, several times faster here
    scale = scale.clamp_min_(TINY_SCALE).div_(INT8_MAX)
    return torch.div(x, scale).round_().to(torch.int8), scale


def linear_int8(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """x (rows, in) float32 times an int8 weight: (rows, out) float32, bias included."""
    values, scale = quantize_rows(x)
    return _dequantize(torch._int_mm(values, weight.kernel), scale, weight)


def _dequantize(product: torch.Tensor, scale: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """The float32 result of an int32 product of int8 rows with row scales `scale`."""
    y = torch.mul(product, scale).mul_(weight.scale)  # int32 * float32 -> float32
    return y if weight.bias is None else y.add_(weight.bias)


class Int8Linear:
    """x W^T + b for a float32 weight W (out, in) and bias b, run in int8 (module docstring).

    Holds the int8 weight made from the float32 one, and makes it again when the float32
    tensors change (replaced, or written in place).
    """

    def __init__(self) -> None:
        self._cached: tuple = ((), None)  # (key of the float32 tensors, Int8Weight)

    def weight(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> Int8Weight:
        """The int8 form of `weight` and `bias`, made once per version of them."""
        key = _tensors_key(weight, bias)
        cached_key, int8 = self._cached
        if key != cached_key:
            int8 = Int8Weight(weight, bias)
            self._cached = (key, int8)  # one assignment: threads see the old or the new pair
        return int8

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return linear_int8(x, self.weight(weight, bias))

    def __getstate__(self) -> dict:
        """For copy and pickle: without the int8 weight (made again on first use)."""
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


class Int8Cell:
    """An LSTM cell's `products` in int8: the int8 weights of its input, recurrent and
    projection products, and the products of a step (`lstm.run_cells`) from them."""

    def __init__(self) -> None:
        self.input = Int8Linear()
        self.recurrent = Int8Linear()
        self.projection = Int8Linear()

    def __call__(
        self, cells: Sequence[LstmCellWithProjection], inputs: Sequence[torch.Tensor]
    ) -> Products:
        """The products of a step of `cells` (each switched to int8): in int8, or in float32
        where autograd records them (fine-tuning)."""
        if fast_paths.records_autograd(*inputs, modules=cells):
            return Float32Products(cells, inputs)
        return Int8Products(cells)


def _tensors_key(*tensors: Optional[torch.Tensor]) -> tuple:
    """Changes whenever one of the tensors is replaced or modified in place."""
    return tuple(
        None if t is None else (t.data_ptr(), t._version, t.shape, t.stride()) for t in tensors
    )


# ---------------------------------------------------------------------- switching a biLM
def set_quantize(bilm: BiLMModule, mode: Optional[str]) -> BiLMModule:
    """Run the products of `bilm` (a `model.BiLM`) in int8 ("int8") or in float32 (None,
    "none"), in place; returns the same biLM. Cheap when the mode is already set."""
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
        _warn_if_slow_here(mode)
    int8 = mode == "int8"
    cnn = bilm.char_cnn
    for highway in cnn.highways:
        highway.int8 = Int8Linear() if int8 else None
    has_projection = isinstance(cnn.projection, torch.nn.Linear)
    cnn.projection_int8 = Int8Linear() if int8 and has_projection else None
    cell_products = {None: Float32Products, "int8": Int8Cell, "bf16": Bf16Cell}[mode]
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        for cell in stack.layers:
            cell.products = cell_products() if mode else Float32Products
    bilm.quantize = mode
    return bilm


class Int8SpeedWarning(RuntimeWarning):
    """int8 or bfloat16 was switched on where torch has no fast kernel for its products."""


_warned_slow: set = set()


def _warn_if_slow_here(mode: str) -> None:
    """Warn once per process and mode where the CPU has no fast kernel for it: int8 where
    torch's CPU kernels stop at AVX2 (or below), as its int8 product (`torch._int_mm`) has no
    vectorised kernel there and the int8 biLM is many times slower than float32; bf16 where
    oneDNN has no bfloat16 instructions (AVX-512 BF16 or AMX) and emulates them
    (docs/performance.md, "int8 on the CPU", "bfloat16 on the CPU")."""
    if mode in _warned_slow:
        return
    if mode == "int8":
        capability = torch.backends.cpu.get_cpu_capability()
        if capability.startswith("AVX512") or capability.startswith("AMX"):
            return
        message = (
            f"quantize='int8' on a CPU where torch's kernels go up to {capability}: torch has "
            "no fast int8 matrix product there, and the int8 biLM runs many times slower than "
            "float32 (measured at 0.1x on an AVX2 CPU, docs/performance.md). Keep float32 (the "
            "default) unless the CPU has AVX-512 VNNI or AMX"
        )
    else:
        if bf16_is_native():
            return
        message = (
            "quantize='bf16' on a CPU without bfloat16 instructions (AVX-512 BF16 or AMX): "
            "oneDNN emulates them there, and the biLM runs slower than in float32. Keep float32 "
            "(the default) on this CPU"
        )
    _warned_slow.add(mode)
    warnings.warn(message, Int8SpeedWarning, stacklevel=3)


def bf16_is_native() -> bool:
    """Whether oneDNN multiplies bfloat16 matrices with the CPU's own instructions here."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


def quantize_int8(bilm: BiLMModule) -> BiLMModule:
    """Switch `bilm` to int8 products (in place; the module docstring says which); returns it."""
    return set_quantize(bilm, "int8")


def quantize_mode(bilm: nn.Module) -> Optional[str]:
    """The mode `bilm` runs in: "int8", "bf16", or None for float32."""
    return getattr(bilm, "quantize", None)


# ---------------------------------------------------------------------- the LSTM step
class Int8Products:
    """The products of a step of k LSTM cells (`lstm.Products`) in int8, without autograd: the
    input product per cell; the recurrent and projection products with the rows of all k cells
    quantised together and one int8 GEMM per cell."""

    def __init__(self, cells: Sequence[LstmCellWithProjection]) -> None:
        self.input_weights = [cell.products.input.weight(cell.input_weight) for cell in cells]
        self.recurrent = _StepWeights(
            [cell.products.recurrent.weight(cell.recurrent_weight) for cell in cells]
        )
        self.projection_weights = (
            _StepWeights(
                [cell.products.projection.weight(cell.projection_weight) for cell in cells]
            )
            if cells[0].projection_weight is not None
            else None
        )

    def input_gates(
        self, inputs: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        first = inputs[0]
        gates = first.new_empty(
            (len(inputs), first.shape[0], self.input_weights[0].kernel.shape[1])
        )
        for d, (x, weight, bias) in enumerate(zip(inputs, self.input_weights, biases)):
            values, scale = quantize_rows(x)
            product = torch._int_mm(values, weight.kernel)
            torch.mul(product, scale, out=gates[d]).mul_(weight.scale).add_(bias)
        return gates  # (k, rows, 4D)

    def recurrent_gates(self, h: torch.Tensor, gates: torch.Tensor, rows: slice) -> torch.Tensor:
        z = self.recurrent.products(h)  # (k, active, 4D)
        return z.add_(gates[:, rows])

    def projection(self, m: torch.Tensor) -> torch.Tensor:
        return self.projection_weights.products(m)  # (k, active, P)

    def in_place(self, z: torch.Tensor) -> bool:
        return True  # never under autograd (`Int8Cell`), with the fast paths on or off

    def compiled_steps(self) -> Optional[fast_paths.CompiledSteps]:
        compiled = fast_paths.ENABLED and fast_paths.COMPILED_STEPS
        if not compiled or self.projection_weights is None:
            return None
        return fast_paths.CompiledSteps(
            "int8",
            [weight.kernel for weight in self.input_weights],
            [weight.scale for weight in self.input_weights],
            self.recurrent.kernels,
            self.recurrent.scales,
            self.projection_weights.kernels,
            self.projection_weights.scales,
        )


class _StepWeights:
    """The int8 weights of one product of the k cells of a step, for `products`."""

    def __init__(self, weights: Sequence[Int8Weight]) -> None:
        self.kernels = [weight.kernel for weight in weights]  # k x (in, out) int8
        self.scales = torch.stack([weight.scale for weight in weights])[:, None, :]  # (k, 1, out)

    def products(self, x: torch.Tensor) -> torch.Tensor:
        """x[d] (rows, in) times the weight of cell d, d < k: (k, rows, out) float32. The rows
        of all k are quantised together (each with its own scale); one int8 GEMM per cell."""
        values, scale = quantize_rows(x)  # (k, rows, in), (k, rows, 1)
        product = values.new_empty((*values.shape[:2], self.kernels[0].shape[1]), dtype=torch.int32)
        for v, kernel, out in zip(values, self.kernels, product):
            torch._int_mm(v, kernel, out=out)
        return torch.mul(product, scale).mul_(self.scales)


# ---------------------------------------------------------------------- bfloat16
class Bf16Kernels:
    """The bfloat16 (in, out) kernels of k (out, in) float32 weights, as one (k, in, out)
    stack; made again when the float32 tensors change (replaced, or written in place)."""

    def __init__(self) -> None:
        self._cached: tuple = ((), None)  # (key of the float32 tensors, stack)

    def stack(self, weights: Sequence[torch.Tensor]) -> torch.Tensor:
        key = _tensors_key(*weights)
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


class Bf16Cell:
    """An LSTM cell's `products` in bfloat16 (the first cell of a step keeps the kernels of
    all k cells stepped with it): the products of a step from them."""

    def __init__(self) -> None:
        self.input = Bf16Kernels()
        self.recurrent = Bf16Kernels()
        self.projection = Bf16Kernels()

    def __call__(
        self, cells: Sequence[LstmCellWithProjection], inputs: Sequence[torch.Tensor]
    ) -> Products:
        """The products of a step of `cells` in bfloat16, or in float32 where autograd records
        them (fine-tuning)."""
        if fast_paths.records_autograd(*inputs, modules=cells):
            return Float32Products(cells, inputs)
        return Bf16Products(self, cells)


class Bf16Products:
    """The products of a step of k LSTM cells (`lstm.Products`) in bfloat16, without autograd:
    the input rows, the state h and the cell output m are rounded to bfloat16 and multiplied
    with bfloat16 kernels (oneDNN: AMX or AVX-512 BF16, float32 sums; `fast_paths.bf16_product`),
    each product rounded to bfloat16 and added to the rest in float32."""

    def __init__(self, kernels: Bf16Cell, cells: Sequence[LstmCellWithProjection]) -> None:
        self.input_kernels = list(kernels.input.stack([cell.input_weight for cell in cells]))
        self.recurrent = kernels.recurrent.stack([cell.recurrent_weight for cell in cells])
        self.projection_kernels = (
            kernels.projection.stack([cell.projection_weight for cell in cells])
            if cells[0].projection_weight is not None
            else None
        )

    def input_gates(
        self, inputs: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        first = inputs[0]
        gates = first.new_empty((len(inputs), first.shape[0], self.input_kernels[0].shape[1]))
        for d, (x, kernel, bias) in enumerate(zip(inputs, self.input_kernels, biases)):
            gates[d].copy_(fast_paths.bf16_product(x, kernel)).add_(bias)
        return gates  # (k, rows, 4D)

    def recurrent_gates(self, h: torch.Tensor, gates: torch.Tensor, rows: slice) -> torch.Tensor:
        z = fast_paths.bf16_product(h, self.recurrent).to(torch.float32)
        return z.add_(gates[:, rows])  # (k, active, 4D)

    def projection(self, m: torch.Tensor) -> torch.Tensor:
        product = fast_paths.bf16_product(m, self.projection_kernels)
        return product.to(torch.float32)  # (k, active, P)

    def in_place(self, z: torch.Tensor) -> bool:
        return True  # never under autograd (`Bf16Cell`), with the fast paths on or off

    def compiled_steps(self) -> Optional[fast_paths.CompiledSteps]:
        compiled = fast_paths.ENABLED and fast_paths.COMPILED_STEPS
        if not compiled or self.projection_kernels is None:
            return None
        none = self.recurrent.new_empty((0,), dtype=torch.float32)
        return fast_paths.CompiledSteps(
            "bfloat16",
            self.input_kernels,
            [none] * len(self.input_kernels),
            [self.recurrent],
            none,
            [self.projection_kernels],
            none,
        )
