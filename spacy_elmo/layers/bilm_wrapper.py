"""The torch biLM as a Thinc layer: char ids (batch, time, 50) -> layers (L + 1, batch, time, 2P).

Serialised as msgpack {options, safetensors weights}: no pickle, and independent of thinc's
default torch (de)serialiser. Before its weights are known (architecture left to the weights)
the layer holds a `PendingBiLM`, which the loaded biLM replaces (`in_place_of`). An optimiser
step writes into the weights in place (`BiLMShim`), which keeps the memory layout of
`bilm.lstm.lay_out`.
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
from ..bilm.tokens import TOKEN_CACHE_SIZE
from ..weights.tensors import check_weights


class PendingBiLM(torch.nn.Module):
    """Stands in for a biLM whose architecture comes from weights that are not loaded yet (the
    elmo model runs only once they are: `elmo_model.forward`)."""

    options = None
    lexicon = None
    stateful = False
    token_cache_size = TOKEN_CACHE_SIZE


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


class NonFiniteUpdate(ValueError):
    """A fine-tuning step of the biLM met a NaN or infinite gradient or weight: not applied."""


class BiLMShim(PyTorchShim):
    """thinc's `PyTorchShim`, but an optimiser step writes the new values into the weights
    rather than replacing their tensors, so that the weights keep their memory layout.

    A step is all or nothing: a NaN or infinite gradient (a loss that overflowed downstream),
    or new weights that are not finite (a learning rate that blows them up), raise
    `NonFiniteUpdate` with every weight left as it was, instead of fine-tuning a NaN biLM.
    """

    def predict(self, inputs: ArgsKwargs) -> Any:
        """The biLM without autograd, as thinc's `PyTorchShim.predict`, but the modules are
        switched to eval mode and back only where that changes something: the biLM's only
        train-mode behaviour is pretraining's dropout on the LSTM inputs. Switching its twenty
        modules twice a call costs more than a short sentence's char CNN."""
        bilm = self._model
        switch = bilm.training and bool(bilm.forward_lstm.dropout or bilm.backward_lstm.dropout)
        if switch:
            bilm.eval()
        try:
            with torch.no_grad():
                if self._mixed_precision:
                    with torch.autocast(device_type="cuda", enabled=True):
                        return bilm(*inputs.args, **inputs.kwargs)
                return bilm(*inputs.args, **inputs.kwargs)
        finally:
            if switch:
                bilm.train()

    def finish_update(self, optimizer: Optimizer) -> None:
        params = [(n, w) for n, w in self._model.named_parameters() if w.grad is not None]
        try:
            if not self._grad_scaler.found_inf:  # no step when a gradient overflowed
                self._step(params, optimizer)
        finally:  # the gradients are spent, applied or not
            for _, weight in params:
                weight.grad.zero_()
            self._grad_scaler.update()

    def _step(self, params: list[tuple[str, torch.nn.Parameter]], optimizer: Optimizer) -> None:
        _check_finite([(name, weight.grad) for name, weight in params], "gradient")
        updates = []
        for name, weight in params:
            # Contiguous (out, in) arrays, whatever the layout: thinc's optimiser then updates
            # a plain copy and sums the gradient norm in row order. A copy, so that the weight
            # is written only once every new value is known to be finite.
            data = weight.data.clone(memory_format=torch.contiguous_format)
            grad = weight.grad.contiguous()
            values, _ = optimizer((self.id, name), torch2xp(data), torch2xp(grad))
            updates.append((name, xp2torch(values, device=weight.device)))
        _check_finite(updates, "updated weight")
        for (_, weight), (_, new) in zip(params, updates):
            # Through `.data`, as thinc's in-place step: a graph built before this update and
            # backpropagated after it (spaCy's listeners lag one step) is not invalidated.
            weight.data.copy_(new)
        # which torch's version counters do not see: the biLM drops what it computed from the
        # old weights
        self._model.weights_changed()


def _check_finite(named: list[tuple[str, torch.Tensor]], what: str) -> None:
    """NonFiniteUpdate naming the first of the `named` tensors that holds NaN or inf."""
    for name, tensor in named:
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = tensor.flatten()[int((~finite).flatten().nonzero()[0])].item()
            raise NonFiniteUpdate(
                f"fine-tuning the elmo biLM: the {what} of '{name}' holds {bad} "
                f"({int((~finite).sum()):,} of {tensor.numel():,} values); the update was not "
                "applied and the biLM's weights are unchanged. A loss that overflowed "
                "downstream or a learning rate too high for fine-tuning "
                "(training.optimizer.learn_rate) makes them; lower it, or keep the biLM frozen"
            )


def in_place_of(bilm: BiLM, current: torch.nn.Module, device: torch.device) -> BiLM:
    """`bilm` on `device` with the mode and run settings of `current`, the module it replaces."""
    bilm.stateful = current.stateful
    bilm.token_cache_size = current.token_cache_size
    return bilm.train(current.training).to(device)


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
    check_weights(state, "serialised elmo model")
    loaded = BiLM._from_state(options, state, bilm.stateful)
    if msg.get("lexicon") is not None:
        from ..weights.elmoformanylangs import EfmlLexicon

        loaded.set_lexicon(EfmlLexicon.from_json(msg["lexicon"], "serialised elmo model"))
    return in_place_of(loaded, bilm, device)
