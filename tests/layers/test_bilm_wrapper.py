"""The biLM's Thinc layer: an optimiser step keeps the weights' layout (`BiLMShim`) and updates
them as thinc's own `PyTorchShim` updates plain weights."""

from __future__ import annotations

import copy
import warnings

import torch
from thinc.api import Adam, ArgsKwargs, PyTorchShim

from spacy_elmo import BiLM
from spacy_elmo.bilm import batch_to_ids, lstm, model
from spacy_elmo.description.options import BiLMOptions
from spacy_elmo.layers.bilm_wrapper import BiLMShim

from ..bilm.util import tiny_options


def plain_shim(bilm: BiLM) -> tuple[PyTorchShim, BiLM]:
    """Thinc's own shim around a copy with the same weights, each in its own contiguous
    (out, in) memory (given after the shim is made: its `.to()` would lay them out again)."""
    plain = copy.deepcopy(bilm)
    shim = PyTorchShim(plain)
    for parameter in plain.parameters():
        parameter.data = parameter.detach().clone(memory_format=torch.contiguous_format)
    return shim, plain


def test_an_optimiser_step_keeps_the_layout_and_matches_thinc(monkeypatch):
    monkeypatch.setattr(model, "FAST_PATHS", True)
    torch.manual_seed(0)
    bilm = BiLM(BiLMOptions.from_dict(tiny_options()))
    thinc_shim, plain = plain_shim(bilm)
    initial = {name: weight.detach().clone() for name, weight in bilm.named_parameters()}
    cells = [stack.layers[1] for stack in (bilm.forward_lstm, bilm.backward_lstm)]
    assert not cells[0].recurrent_weight.is_contiguous()  # laid out by `lstm.lay_out`
    assert (
        cells[0].recurrent_weight.data_ptr()
        != plain.forward_lstm.layers[1].recurrent_weight.data_ptr()
    )
    assert plain.forward_lstm.layers[1].recurrent_weight.is_contiguous()
    shims = {"laid out": BiLMShim(bilm), "thinc": thinc_shim}
    optimisers = {name: Adam(0.01, grad_clip=1.0) for name in shims}
    char_ids = batch_to_ids([["the", "river", "bank"], ["a", "bank"]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "grad and param do not obey the layout contract"
        for _ in range(3):
            for name, shim in shims.items():
                (shim._model(char_ids).layers ** 2).sum().backward()
                shim.finish_update(optimisers[name])
    for (name, got), (_, want) in zip(bilm.named_parameters(), plain.named_parameters()):
        assert torch.equal(got, want), name
        assert not torch.equal(got, initial[name]), name  # the step changed it
    with torch.no_grad():
        kernels = lstm.layer_kernels(cells)
        (recurrent,), (projection,) = kernels.recurrent, kernels.projection
    for d, cell in enumerate(cells):  # still views of one (2, in, out) tensor
        assert cell.recurrent_weight.data_ptr() == recurrent[d].data_ptr()
        assert cell.projection_weight.data_ptr() == projection[d].data_ptr()


def test_predict_matches_thinc_and_leaves_the_mode_as_it_found_it():
    torch.manual_seed(0)
    bilm = BiLM(BiLMOptions.from_dict(tiny_options()))
    char_ids = batch_to_ids([["the", "river", "bank", "."], ["a", "bank"]])
    thinc_shim, _ = plain_shim(bilm)
    shim = BiLMShim(bilm)
    inputs = ArgsKwargs(args=(char_ids,), kwargs={})
    want = thinc_shim.predict(inputs).layers  # thinc's: every module in eval mode
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        stack.dropout = 0.5  # pretraining's dropout, which eval mode turns off
    for training in (True, False):
        bilm.train(training)
        got = shim.predict(inputs).layers
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        assert not got.requires_grad
        assert all(module.training == training for module in bilm.modules())
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        stack.dropout = 0.0
    bilm.train()
    torch.testing.assert_close(shim.predict(inputs).layers, want, rtol=1e-6, atol=1e-6)
    assert all(module.training for module in bilm.modules())  # not switched: nothing to switch
