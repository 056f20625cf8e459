"""The torch biLM as a Thinc layer: char ids (batch, time, 50) -> layers (L + 1, batch, time, 2P).

Serialised as msgpack {options, safetensors weights}: no pickle, and independent of thinc's
default torch (de)serialiser. Before its weights are known (architecture left to the weights)
the layer holds a `PendingBiLM`, which `install_bilm` replaces. An optimiser step writes into
the weights in place (`BiLMShim`), which keeps the memory layout of `bilm.fast_paths.lay_out`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Tuple

import srsly
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from thinc.api import ArgsKwargs, Model, Optimizer, PyTorchShim, torch2xp, xp2torch
from thinc.layers.pytorchwrapper import forward as pytorch_forward
from thinc.types import Floats4d, Ints3d

from ..bilm import BiLM, BiLMOptions
from ..bilm.io import check_finite
from ..bilm.model import TOKEN_CACHE_SIZE


class PendingBiLM(torch.nn.Module):
    """Stands in for a biLM whose architecture comes from weights that are not loaded yet."""

    options = None
    lexicon = None

    def __init__(self) -> None:
        super().__init__()
        self.stateful = False
        self.token_cache_size = TOKEN_CACHE_SIZE

    def forward(self, char_ids: torch.Tensor):
        raise ValueError(
            "the elmo model has no weights yet (its architecture comes from the weights): "
            "initialize the pipeline first"
        )


def bilm_layer(bilm: torch.nn.Module) -> Model[Ints3d, Floats4d]:
    """Wrap `bilm`; gradients reach its parameters only through `begin_update`.

    thinc's `PyTorchWrapper.v3`, with a `BiLMShim` in place of its `PyTorchShim`.
    """
    shim = BiLMShim(bilm, serialize_model=serialize_bilm, deserialize_model=deserialize_bilm)
    return Model(
        "pytorch",
        pytorch_forward,
        attrs={"convert_inputs": _convert_inputs, "convert_outputs": _convert_outputs},
        shims=[shim],
        dims={"nI": None, "nO": None},
    )


class BiLMShim(PyTorchShim):
    """thinc's `PyTorchShim`, but an optimiser step writes the new values into the weights
    rather than replacing their tensors, so that the weights keep their memory layout."""

    def finish_update(self, optimizer: Optimizer) -> None:
        for name, weight in self._model.named_parameters():
            if weight.grad is None:
                continue
            if not self._grad_scaler.found_inf:  # no step when a gradient overflowed
                # Contiguous (out, in) arrays, whatever the layout: thinc's optimiser then
                # updates a plain weight in place and sums the gradient norm in row order.
                data, grad = weight.data.contiguous(), weight.grad.contiguous()
                values, _ = optimizer((self.id, name), torch2xp(data), torch2xp(grad))
                new = xp2torch(values, device=weight.device)
                if new.data_ptr() != weight.data_ptr():  # else updated in place already
                    with torch.no_grad():
                        weight.copy_(new)
            weight.grad.zero_()
        self._grad_scaler.update()


def torch_bilm(layer: Model) -> BiLM:
    """The torch module inside a `bilm_layer` (a `PendingBiLM` before weights are known)."""
    return layer.shims[0]._model


def install_bilm(layer: Model, bilm: BiLM) -> None:
    """Put `bilm` (another architecture than the current module's) into a `bilm_layer`."""
    shim = layer.shims[0]
    current = shim._model
    bilm.stateful = current.stateful
    bilm.token_cache_size = current.token_cache_size
    shim._model = bilm.train(current.training).to(shim.device)


def _convert_inputs(
    model: Model, char_ids: Ints3d, is_train: bool
) -> Tuple[ArgsKwargs, Callable[[Any], Any]]:
    ids = xp2torch(model.ops.asarray(char_ids, dtype="int64"))
    return ArgsKwargs(args=(ids,), kwargs={}), lambda d_inputs: []


def _convert_outputs(model: Model, inputs_outputs, is_train: bool):
    _, output = inputs_outputs
    layers = output.layers  # (L + 1, batch, time, 2P)

    def get_d_torch(d_layers: Floats4d) -> ArgsKwargs:
        grad = xp2torch(d_layers).to(layers.dtype)
        return ArgsKwargs(args=(layers,), kwargs={"grad_tensors": (grad,)})

    return torch2xp(layers, ops=model.ops), get_d_torch


def serialize_bilm(bilm: BiLM) -> bytes:
    if bilm.options is None:  # a PendingBiLM: nothing to save
        return srsly.msgpack_dumps({"options": None, "weights": None})
    state = {k: v.detach().cpu().contiguous() for k, v in bilm.state_dict().items()}
    msg = {"options": json.dumps(bilm.options.to_dict()), "weights": save_safetensors(state)}
    if bilm.lexicon is not None:  # an ELMoForManyLangs model's dictionaries, as JSON
        msg["lexicon"] = bilm.lexicon.to_json()
    return srsly.msgpack_dumps(msg)


def deserialize_bilm(bilm: BiLM, data: bytes, device: torch.device) -> BiLM:
    msg = srsly.msgpack_loads(data)
    if msg["options"] is None:
        return PendingBiLM().to(device)
    options = BiLMOptions.from_dict(json.loads(msg["options"]), source="serialised elmo model")
    # A new module around the loaded tensors (the current one's weights are not copied into).
    state = load_safetensors(msg["weights"])
    check_finite(state, "serialised elmo model")
    loaded = BiLM._from_state(options, state, bilm.stateful)
    loaded.token_cache_size = bilm.token_cache_size
    if msg.get("lexicon") is not None:
        from ..bilm.elmoformanylangs import EfmlLexicon

        loaded.set_lexicon(EfmlLexicon.from_json(msg["lexicon"], "serialised elmo model"))
    return loaded.train(bilm.training).to(device)
