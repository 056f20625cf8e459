"""Loading holds the weights once: no random initialisation, no second copy of the file."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import h5py
import numpy as np
import torch

from spacy_elmo import BiLM

from .util import tiny_options, write_random_model


def test_loading_holds_the_weights_once(tmp_path):
    """NumPy's allocations (traced) while loading peak at the weights plus one dataset.

    Reading every dataset, then converting them all, then copying them into a freshly
    initialised module would hold two to three copies.
    """
    options = tiny_options(lstm__dim=512, lstm__projection_dim=64)
    options_file, weight_file = write_random_model(tmp_path, options, seed=1)
    sizes: list[int] = []
    with h5py.File(weight_file, "r") as hdf5:
        hdf5.visititems(
            lambda _, item: sizes.append(item.size * 4) if isinstance(item, h5py.Dataset) else None
        )
    weights, largest = sum(sizes), max(sizes)
    tracemalloc.start()
    try:
        bilm = BiLM.from_allennlp(options_file, weight_file)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    parameters = sum(p.numel() * 4 for p in bilm.parameters())
    assert weights >= parameters - 261 * 4 * 4  # the file has no "no token" embedding row
    assert peak <= weights + largest + (1 << 20), (peak, weights, largest)


def test_uninitialised_module_leaves_its_weights_untouched():
    """`initialise=False` (what loading builds on) does not touch the parameters' memory."""
    script = """
import json, sys
import torch
from spacy_elmo import BiLM
from spacy_elmo.pretrain.presets import preset
from spacy_elmo.description.options import BiLMOptions

def rss():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

options = BiLMOptions.from_dict(preset("original"))
before = rss()
bilm = BiLM(options, initialise=sys.argv[1] == "1")
weights = 4 * sum(p.numel() for p in bilm.parameters())
print(json.dumps({"growth": rss() - before, "weights": weights}))
"""
    growth = {}
    for initialise in ("0", "1"):
        out = subprocess.run(
            [sys.executable, "-c", script, initialise], capture_output=True, text=True, check=True
        ).stdout
        growth[initialise] = json.loads(out.splitlines()[-1])
    weights = growth["1"]["weights"]
    assert growth["1"]["growth"] > 0.8 * weights  # initialising writes every weight
    assert growth["0"]["growth"] < 0.1 * weights, growth


def test_loaded_parameters_are_float32_and_contiguous(tmp_path):
    bilm = BiLM.from_allennlp(*write_random_model(tmp_path, tiny_options(), seed=2))
    for name, parameter in bilm.named_parameters():
        assert parameter.dtype == torch.float32, name
        assert isinstance(parameter, torch.nn.Parameter) and parameter.requires_grad, name
        if name.endswith(("recurrent_weight", "projection_weight")):
            # Small kernels are laid out (in, out) for the batched step (lstm.lay_out)
            assert parameter.t().is_contiguous(), name
        else:
            assert parameter.is_contiguous(), name
    cell = bilm.forward_lstm.layers[0]
    expected = np.zeros(4 * cell.cell_dim, np.float32)
    expected[2 * cell.cell_dim : 3 * cell.cell_dim] = 1.0  # the forget gate's block
    np.testing.assert_array_equal(cell.forget_bias.numpy(), expected)


def test_a_saved_biLM_is_built_once(tmp_path, monkeypatch):
    """`BiLM.load` of a saved directory builds one BiLM: its tensors are checked against that
    model's own shapes, not those of a second one built for them."""
    options_file, weight_file = write_random_model(tmp_path, tiny_options(), seed=2)
    BiLM.from_allennlp(options_file, weight_file).save(tmp_path / "saved")
    built = []
    original = BiLM.__init__

    def counted(self, *args, **kwargs):
        built.append(kwargs.get("initialise", True))
        original(self, *args, **kwargs)

    monkeypatch.setattr(BiLM, "__init__", counted)
    BiLM.load(tmp_path / "saved")
    assert built == [False]  # one, and its weights never initialised
