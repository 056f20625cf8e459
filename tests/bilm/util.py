"""Random models written straight into the bilm-tf hdf5 layout (docs/MODEL.md §3) by h5py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import h5py
import numpy as np

TINY_OPTIONS = {
    "lstm": {
        "cell_clip": 3,
        "use_skip_connections": True,
        "n_layers": 2,
        "proj_clip": 3,
        "projection_dim": 8,
        "dim": 24,
    },
    "char_cnn": {
        "embedding": {"dim": 4},
        "filters": [[1, 4], [2, 6], [3, 8]],
        "n_highway": 1,
        "n_characters": 262,
        "max_characters_per_token": 50,
        "activation": "relu",
    },
}


def tiny_options(**changes) -> dict:
    """TINY_OPTIONS with `section__key=value` changes, e.g. lstm__use_skip_connections=False."""
    options = copy.deepcopy(TINY_OPTIONS)
    for name, value in changes.items():
        section, key = name.split("__")
        options[section][key] = value
    return options


def write_random_model(directory: Path, options: dict, seed: int = 0, scale: float = 0.5):
    """Write options.json and weights.hdf5 with random values; return both paths."""
    rng = np.random.default_rng(seed)
    cnn, lstm = options["char_cnn"], options["lstm"]
    e = cnn["embedding"]["dim"]
    F = sum(n for _, n in cnn["filters"])
    P, D, L = lstm["projection_dim"], lstm["dim"], lstm.get("n_layers", 1)

    def rand(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    data = {"char_embed": rand(261, e)}
    for k, (w, n) in enumerate(cnn["filters"]):
        data[f"CNN/W_cnn_{k}"] = rand(1, w, e, n)
        data[f"CNN/b_cnn_{k}"] = rand(n)
    for h in range(cnn.get("n_highway", 0)):
        g = f"CNN_high_{h}/"
        data[g + "W_transform"], data[g + "b_transform"] = rand(F, F) / np.sqrt(F), rand(F)
        data[g + "W_carry"], data[g + "b_carry"] = rand(F, F) / np.sqrt(F), rand(F) - 2
    if F != P:
        data["CNN_proj/W_proj"], data["CNN_proj/b_proj"] = rand(F, P), rand(P)
    hidden = P if P < D else D
    for d in range(2):
        for layer in range(L):
            pre = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
            data[pre + "W_0"] = rand(P + hidden, 4 * D)
            data[pre + "B"] = rand(4 * D)
            if P < D:
                data[pre + "W_P_0"] = rand(D, P)
    directory.mkdir(parents=True, exist_ok=True)
    options_file, weight_file = directory / "options.json", directory / "weights.hdf5"
    options_file.write_text(json.dumps(options))
    with h5py.File(weight_file, "w") as f:
        for name, array in data.items():
            f.create_dataset(name, data=array.astype(np.float32))
    return options_file, weight_file


def same_weights(a, b) -> None:
    """Two BiLMs have the same options and bit-identical tensors."""
    import torch

    assert a.options == b.options
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def fixture_bilm(fixture: Path, **kwargs):
    """The TensorFlow fixture's biLM (options.json + lm_weights.hdf5) as a BiLM."""
    from spacy_elmo import BiLM

    return BiLM.from_allennlp(fixture / "options.json", fixture / "lm_weights.hdf5", **kwargs)


def fixture_sentences(fixture: Path) -> list[list[list[str]]]:
    """The fixture's three streams of tokenised sentences."""
    with open(fixture / "sentences.json") as f:
        return [[s.split() for s in group] for group in json.load(f)]


def fixture_top_layer(fixture: Path, k: int, i: int) -> np.ndarray:
    """The top layer TensorFlow gave stream `k`'s sentence `i`: (n, 2P), forward then backward."""
    with h5py.File(fixture / f"lm_embeddings_{k}.hdf5", "r") as f:
        halves = f[str(i)][...]  # (2, n, P): forward, backward
    return np.concatenate([halves[0], halves[1]], axis=-1)
