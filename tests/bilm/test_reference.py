"""All layers against an independent NumPy implementation (docs/MODEL.md), for several shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spacy_elmo import BiLM

from .numpy_reference import NumpyBiLM
from .util import tiny_options, write_random_model

SENTENCES = [
    ["The", "river", "bank", "overflowed", "."],
    [],
    ["Don", "'t", "!"],
    ["a" * 60, "é", "北京", "😀", " ", "\t", "x"],
]

VARIANTS = {
    "default": tiny_options(),
    "no_skip": tiny_options(lstm__use_skip_connections=False),
    "tanh_no_highway": tiny_options(char_cnn__activation="tanh", char_cnn__n_highway=0),
    "two_highways_three_layers": tiny_options(char_cnn__n_highway=2, lstm__n_layers=3),
    "no_clipping": tiny_options(lstm__cell_clip=0, lstm__proj_clip=0),
    # F == P: bilm-tf has no CNN projection; P == D: no LSTM projection.
    "no_projections": tiny_options(
        char_cnn__filters=[[1, 4], [2, 4]], lstm__projection_dim=8, lstm__dim=8
    ),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_all_layers_match_numpy(tmp_path, name):
    options_file, weight_file = write_random_model(tmp_path, VARIANTS[name], seed=1)
    reference = NumpyBiLM(options_file, weight_file)
    outputs = BiLM.from_allennlp(options_file, weight_file).embed(SENTENCES, batch_size=3)
    n_layers = VARIANTS[name]["lstm"]["n_layers"]
    for tokens, got in zip(SENTENCES, outputs):
        expected, _, _ = reference.sentence(tokens)
        assert got.shape == expected.shape == (n_layers + 1, len(tokens), got.shape[-1])
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_fixture_model_all_layers_match_numpy(allennlp_fixture):
    reference = NumpyBiLM(allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5")
    with open(allennlp_fixture / "sentences.json") as f:
        sentences = [s.split() for s in json.load(f)[1]]
    bilm = BiLM.from_allennlp(
        allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5"
    )
    for tokens, got in zip(sentences, bilm.embed(sentences, batch_size=4)):
        np.testing.assert_allclose(got, reference.sentence(tokens)[0], atol=1e-5, rtol=0)


def test_stateful_carry_matches_numpy_with_explicit_states(tmp_path):
    options_file, weight_file = write_random_model(tmp_path, tiny_options(), seed=2)
    reference = NumpyBiLM(options_file, weight_file)
    bilm = BiLM.from_allennlp(options_file, weight_file, stateful=True)
    batches = [[["a", "b"], ["c"]], [["d", "e", "f"], ["g", "h"]], [["i"]]]
    states = {}
    for batch in batches:
        outputs = bilm.embed(batch, batch_size=len(batch))
        for row, (tokens, got) in enumerate(zip(batch, outputs)):
            fwd, bwd = states.get(row, (None, None))
            expected, fwd, bwd = reference.sentence(tokens, fwd, bwd)
            states[row] = (fwd, bwd)
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
