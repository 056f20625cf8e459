"""The bundled English biLM: `nlp.add_pipe("elmo")` works offline and ELMo's sense check holds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import spacy

from spacy_elmo.pipeline.loaders import BUNDLED_FILES, BUNDLED_MAX_BYTES, BUNDLED_MODEL

RIVER_1 = "The river bank overflowed after heavy rain"
FINANCE = "The investment bank approved the commercial acquisition"
RIVER_2 = "The river bank flooded after the storm"


@pytest.fixture(scope="module")
def nlp():
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo")
    return nlp


def bank(doc):
    return next(t for t in doc if t.text == "bank")._.elmo_layers


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_bundled_model_is_small_and_documented():
    assert sum((BUNDLED_MODEL / f).stat().st_size for f in BUNDLED_FILES) <= BUNDLED_MAX_BYTES
    shipped = {path.name for path in BUNDLED_MODEL.iterdir()}
    assert shipped == {*BUNDLED_FILES, "pretrain.json"}
    summary = json.loads((BUNDLED_MODEL / "pretrain.json").read_text())
    # The bundled biLM's held-out perplexity is 135.6; a random model's is about 50,000.
    assert summary["tokens_seen"] > 10**6 and summary["held_out"]["ppl"] < 200


HELD_OUT = """The company said on Monday that its profits rose in the third quarter .
He said he would not run for president again .
The government announced new measures to reduce unemployment .
Prices fell sharply on the stock market yesterday .
She was born in London and studied at the university .
"""


def test_bundled_model_predicts_english(tmp_path):
    """Perplexity on sentences it never saw: about 170; a random model's is about 50,000."""
    from spacy_elmo.pretrain.evaluate import perplexity

    text = tmp_path / "held_out.txt"
    text.write_text(HELD_OUT, encoding="utf-8")
    result = perplexity(BUNDLED_MODEL, [text])
    assert result["sentences"] == 5 and result["tokens"] == 53
    assert result["ppl"] < 400


def test_add_pipe_works_out_of_the_box(nlp):
    doc = nlp(RIVER_1)
    assert doc._.elmo_layers.shape == (3, 7, 256)
    assert doc[2]._.elmo_layers.shape == (3, 256)
    assert doc[2]._.elmo.shape == (256,)


RIVER_SENSE = [
    RIVER_1,
    RIVER_2,
    "They walked along the muddy bank of the river",
    "Fish swam near the grassy bank of the stream",
    "The boat drifted towards the bank of the river",
    "Water rose over the bank of the river",
]
FINANCE_SENSE = [
    FINANCE,
    "The bank raised interest rates on loans",
    "She deposited the money at the bank",
    "The central bank cut interest rates",
    "He borrowed money from the bank to buy a house",
    "The bank approved the loan",
]


def test_layer_two_separates_the_senses_on_average(nlp):
    river = [bank(nlp(text))[2] for text in RIVER_SENSE]
    finance = [bank(nlp(text))[2] for text in FINANCE_SENSE]
    within = [cosine(a, b) for i, a in enumerate(river) for b in river[i + 1 :]]
    within += [cosine(a, b) for i, a in enumerate(finance) for b in finance[i + 1 :]]
    across = [cosine(a, b) for a in river for b in finance]
    assert np.mean(within) > np.mean(across)


def test_bank_sense_check(nlp):
    river_1, finance, river_2 = (bank(nlp(text)) for text in (RIVER_1, FINANCE, RIVER_2))
    np.testing.assert_array_equal(river_1[0], finance[0])  # layer 0 is context-free
    assert np.abs(river_1[1] - finance[1]).max() > 1e-2
    assert np.abs(river_1[2] - finance[2]).max() > 1e-2
    assert cosine(river_1[2], river_2[2]) > cosine(river_1[2], finance[2])


def test_embed_command_uses_the_bundled_biLM(tmp_path):
    import h5py
    from typer.testing import CliRunner

    from spacy_elmo.cli import app

    text = tmp_path / "in.txt"
    text.write_text(RIVER_1 + "\n" + FINANCE + "\n")
    result = CliRunner().invoke(app, ["embed", str(text), str(tmp_path / "out.hdf5"), "-q"])
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "out.hdf5") as f:
        assert f["0"].shape == (3, 7, 256) and f["1"].shape == (3, 7, 256)
