"""ELMo's task-specific layer mix as a Thinc layer: gamma * sum_j s_j h_j, s = softmax(w),
over the L + 1 biLM layers of every token (docs/MODEL.md §9, which says how it differs from
AllenNLP's and bilm-tf's on purpose: gamma stored as its logarithm, a per-token layer norm,
layer dropout over the kept layers). `softmax_weights_and_gamma` reads s and gamma.
"""

import math
from itertools import accumulate
from typing import Callable, List, Optional, Sequence, Tuple

from spacy.util import registry
from thinc.api import Model, Ops
from thinc.types import Floats1d, Floats2d, Floats3d

SCALAR_MIX = "spacy_elmo.ScalarMix.v1"
LAYER_NORM_EPS = 1e-12  # bilm-tf's epsilon (AllenNLP uses 1e-13)
PREDICT_CHUNK_TOKENS = 1024  # tokens mixed at once at inference (see `_predict`)

InT = List[Floats3d]  # one (n_layers, n_tokens, D) array per doc, float16/32/64
OutT = List[Floats2d]  # one (n_tokens, D) array per doc, float32 (float64 for float64 input)


@registry.layers(SCALAR_MIX)
def scalar_mix(
    n_layers: Optional[int] = None,
    *,
    layer_norm: bool = False,
    layer_dropout: float = 0.0,
    initial_weights: Optional[List[float]] = None,
    gamma: float = 1.0,
    trainable: bool = True,
) -> Model[InT, OutT]:
    """Mix the biLM layers of every doc into one (n_tokens, D) array: gamma * sum_j s_j h_j.

    initial_weights are pre-softmax (default 0: s_j = 1 / n_layers). n_layers None: the length
    of initial_weights, else the first dimension of the sample given to `initialize`. With
    trainable=False the weights and gamma are fixed: no gradient is accumulated for them, so
    no optimizer (and no weight decay) touches them; gradients still flow to the inputs.
    """
    if n_layers is None and initial_weights is not None:
        n_layers = len(initial_weights)
    if n_layers is not None and n_layers < 1:
        raise ValueError(f"scalar_mix: n_layers must be at least 1, got {n_layers}")
    if not gamma > 0:
        raise ValueError(f"scalar_mix: gamma must be positive, got {gamma}")
    if not 0.0 <= layer_dropout < 1.0:
        raise ValueError(f"scalar_mix: layer_dropout must be in [0, 1), got {layer_dropout}")
    model: Model[InT, OutT] = Model(
        "scalar_mix",
        forward,
        init=init,
        params={"weights": None, "log_gamma": None},
        attrs={
            "n_layers": n_layers,
            "layer_norm": layer_norm,
            "layer_dropout": layer_dropout,
            "trainable": trainable,
            "initial_gamma": gamma,
        },
    )
    if n_layers is not None:
        _set_initial_params(model, n_layers, initial_weights)
    return model


def _set_initial_params(
    model: Model[InT, OutT], n_layers: int, initial_weights: Optional[List[float]]
) -> None:
    if initial_weights is None:
        initial_weights = [0.0] * n_layers
    check_one_per_layer("scalar_mix: initial_weights", initial_weights, n_layers, "the mix")
    model.attrs["n_layers"] = n_layers
    model.set_param("weights", model.ops.asarray1f([float(w) for w in initial_weights]))
    model.set_param("log_gamma", model.ops.asarray1f([math.log(model.attrs["initial_gamma"])]))


def check_one_per_layer(name: str, values: Sequence[float], n_layers: int, owner: str) -> None:
    """ValueError unless the setting `name` has one value per layer of `owner`."""
    if len(values) != n_layers:
        raise ValueError(
            f"{name} has {len(values)} values {list(values)} but {owner} has {n_layers} layers"
        )


def softmax_weights_and_gamma(model: Model) -> Tuple[List[float], float]:
    """A scalar mix's current s = softmax(w) (a list of n_layers floats) and gamma."""
    ops = model.ops
    weights = ops.to_numpy(_softmax(ops, model.get_param("weights"), None))
    log_gamma = ops.to_numpy(model.get_param("log_gamma"))
    return [float(s) for s in weights], float(math.exp(float(log_gamma[0])))


def init(model: Model[InT, OutT], X: Optional[InT] = None, Y: Optional[OutT] = None) -> None:
    """Set n_layers and the parameters from the sample when n_layers was not given. The
    sample's shapes are checked where every input's are, in the forward pass (which thinc's
    `chain` runs on the sample right after this)."""
    if model.attrs["n_layers"] is None and X:
        _set_initial_params(model, X[0].shape[0], None)


def forward(model: Model[InT, OutT], Xs: InT, is_train: bool) -> Tuple[OutT, Callable]:
    ops = model.ops
    n_layers = model.attrs["n_layers"]
    if n_layers is None:
        raise ValueError("scalar_mix: n_layers is not known yet; initialize the model first")
    _check_inputs(Xs, n_layers)
    if not Xs:
        return [], lambda dYs: []
    in_dtypes = [X.dtype for X in Xs]
    dtype = "float64" if all(d == "float64" for d in in_dtypes) else "float32"
    keep = None
    p_drop = model.attrs["layer_dropout"]
    if is_train and p_drop > 0:
        keep = (ops.get_dropout_mask((n_layers,), p_drop) > 0).astype(dtype)  # (L,)
        if not keep.any():
            keep = None
    weights = _softmax(ops, model.get_param("weights").astype(dtype), keep)  # (L,)
    gamma = ops.xp.exp(model.get_param("log_gamma").astype(dtype))  # (1,)
    if not is_train:
        mixed_docs = _predict(ops, Xs, dtype, weights, gamma, model.attrs["layer_norm"])
        return mixed_docs, lambda dYs: []

    lengths = [X.shape[1] for X in Xs]
    starts = list(accumulate(lengths))[:-1]
    X = ops.xp.concatenate([X.astype(dtype, copy=False) for X in Xs], axis=1)  # (L, N, D)
    _, n_tokens, width = X.shape

    if model.attrs["layer_norm"]:
        H, inv_std = _layer_norm(ops, X)  # (L, N, D), (L, N, 1)
    else:
        H, inv_std = X, None
    mixed = (weights @ H.reshape(n_layers, -1)).reshape(n_tokens, width)  # (N, D)
    Y = gamma * mixed  # (N, D)

    def backprop(dYs: OutT) -> InT:
        dY = ops.xp.concatenate([dY.astype(dtype, copy=False) for dY in dYs], axis=0)  # (N, D)
        d_mixed = gamma * dY
        if model.attrs["trainable"]:
            d_weights = H.reshape(n_layers, -1) @ d_mixed.reshape(-1)  # (L,) d loss / d s
            d_logits = weights * (d_weights - (d_weights * weights).sum())  # softmax backward
            d_log_gamma = (dY * Y).sum(keepdims=True).reshape(1)  # d gamma / d log_gamma = gamma
            model.inc_grad("weights", d_logits.astype("float32", copy=False))  # the params' dtype
            model.inc_grad("log_gamma", d_log_gamma.astype("float32", copy=False))
        dH = weights.reshape(n_layers, 1, 1) * d_mixed.reshape(1, n_tokens, width)  # (L, N, D)
        dX = _layer_norm_backward(H, inv_std, dH) if inv_std is not None else dH
        return [
            ops.xp.ascontiguousarray(d.astype(in_dtype, copy=False))
            for d, in_dtype in zip(ops.xp.split(dX, starts, axis=1), in_dtypes)
        ]

    return list(ops.xp.split(Y, starts, axis=0)), backprop


def _predict(
    ops: Ops, Xs: InT, dtype: str, weights: Floats1d, gamma: Floats1d, layer_norm: bool
) -> OutT:
    """The forward pass without backprop, over chunks of about `PREDICT_CHUNK_TOKENS` tokens
    (small docs together, a long one in slices).

    The same arithmetic as the training path, token by token, but its temporaries stay a few
    MB however many tokens the batch has: whole-batch arrays of (L, N, D) made a 17k-token
    batch's layer norm take 20 times as long as 8.5k tokens' (page faults on fresh memory).
    """
    lengths = [X.shape[1] for X in Xs]
    Y = ops.xp.empty((sum(lengths), Xs[0].shape[2]), dtype=dtype)  # (N, D)
    done, pieces, gathered = 0, [], 0  # tokens mixed; the next chunk's pieces and tokens
    for X in Xs:
        for start in range(0, X.shape[1], PREDICT_CHUNK_TOKENS):
            pieces.append(X[:, start : start + PREDICT_CHUNK_TOKENS])
            gathered += pieces[-1].shape[1]
            if gathered >= PREDICT_CHUNK_TOKENS:
                _mix(ops, pieces, Y[done : done + gathered], weights, gamma, layer_norm)
                done, pieces, gathered = done + gathered, [], 0
    if pieces:
        _mix(ops, pieces, Y[done:], weights, gamma, layer_norm)
    return list(ops.xp.split(Y, list(accumulate(lengths))[:-1], axis=0))


def _mix(
    ops: Ops, pieces: InT, out: Floats2d, weights: Floats1d, gamma: Floats1d, layer_norm: bool
) -> None:
    """Write into `out` (n, D) gamma * sum_j s_j h_j of the (L, n, D) `pieces` joined along
    their tokens, h_j layer-normed where `layer_norm`.

    A sum over the layers rather than the training path's matrix-vector product (equal up to
    float rounding): for the product NumPy's BLAS starts threads of its own, which took the
    cores of the biLM running one batch ahead (the `elmo` component's `overlap`): 1.3x slower.
    """
    X = ops.xp.concatenate(pieces, axis=1).astype(out.dtype, copy=False)  # (L, n, D)
    H = _layer_norm(ops, X)[0] if layer_norm else X
    coefficients = (gamma * weights).astype(H.dtype)  # (L,)
    ops.xp.multiply(H[0], coefficients[0], out=out)
    for j in range(1, H.shape[0]):
        out += H[j] * coefficients[j]


def _softmax(ops: Ops, logits: Floats1d, keep: Optional[Floats1d]) -> Floats1d:
    """softmax(logits) over the layers where keep is 1 (all layers if keep is None)."""
    exp = ops.xp.exp(logits - logits.max())
    if keep is not None:
        exp = exp * keep
    return exp / exp.sum()


def _layer_norm(ops: Ops, X: Floats3d) -> Tuple[Floats3d, Floats3d]:
    """Normalise every (layer, token) vector over its D features; also return 1 / std."""
    mean = X.mean(axis=-1, keepdims=True)  # (L, N, 1)
    centred = X - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)  # (L, N, 1)
    inv_std = 1.0 / ops.xp.sqrt(variance + LAYER_NORM_EPS)
    return centred * inv_std, inv_std


def _layer_norm_backward(H: Floats3d, inv_std: Floats3d, dH: Floats3d) -> Floats3d:
    """Gradient through H = (X - mean) / sqrt(var + eps), mean and var over the last axis."""
    mean_dH = dH.mean(axis=-1, keepdims=True)
    mean_dH_H = (dH * H).mean(axis=-1, keepdims=True)
    return inv_std * (dH - mean_dH - H * mean_dH_H)


def _check_inputs(Xs: Sequence[Floats3d], n_layers: int) -> None:
    """Every doc's input must be (n_layers, n_tokens, D) with one D for the whole batch."""
    widths = set()
    for i, X in enumerate(Xs):
        shape = getattr(X, "shape", None)
        if shape is None or len(shape) != 3 or shape[0] != n_layers:
            raise ValueError(
                f"scalar_mix: input {i} must have shape (n_layers={n_layers}, n_tokens, width), "
                f"got {shape if shape is not None else type(X).__name__}"
            )
        widths.add(shape[2])
    if len(widths) > 1:
        raise ValueError(f"scalar_mix: all inputs must have the same width, got {sorted(widths)}")
