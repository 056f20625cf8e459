"""The biLM architecture and the listener widths come from the weights."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc
from spacy.training import Example
from spacy.training.initialize import init_nlp
from spacy.training.loop import train
from spacy.util import load_model_from_config
from thinc.api import Config

from spacy_elmo import BiLM

from .pipeline_util import listening_tagger_config, synthetic_docs, tiny_nlp, write_train_dev


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_train_dev(tmp_path_factory.mktemp("data"), 24, 6)


def only_the_files(fixture, data) -> Config:
    """A config that names nothing of the biLM but its two AllenNLP files."""
    weights = {
        "@misc": "spacy_elmo.AllenNLPWeights.v1",
        "options_file": str(fixture / "options.json"),
        "weights_file": str(fixture / "lm_weights.hdf5"),
    }
    return listening_tagger_config("en", weights, *data, steps=12, batch_size=8)


def test_config_naming_only_the_weights_files_trains_and_reloads(allennlp_fixture, data, tmp_path):
    options = json.loads((allennlp_fixture / "options.json").read_text())
    # What `spacy init fill-config` does (spaCy's defaults, nothing about the biLM), then train.
    filled = load_model_from_config(only_the_files(allennlp_fixture, data), auto_fill=True).config
    nlp = init_nlp(filled)
    (tmp_path / "out").mkdir()
    train(nlp, tmp_path / "out", stdout=io.StringIO(), stderr=io.StringIO())
    model = nlp.config["components"]["elmo"]["model"]
    assert model["lstm_dim"] == options["lstm"]["dim"]
    assert model["projection_dim"] == options["lstm"]["projection_dim"]
    assert model["filters"] == options["char_cnn"]["filters"]
    assert model["char_embedding_dim"] == options["char_cnn"]["embedding"]["dim"]
    assert model["n_highway"] == options["char_cnn"]["n_highway"]
    assert model["cell_clip"] == options["lstm"]["cell_clip"]
    listener = nlp.config["components"]["tagger"]["model"]["tok2vec"]
    width = 2 * options["lstm"]["projection_dim"]
    assert (listener["width"], listener["n_layers"]) == (width, options["lstm"]["n_layers"] + 1)

    loaded = spacy.load(tmp_path / "out" / "model-last")
    assert loaded.config["components"]["elmo"]["model"]["lstm_dim"] == options["lstm"]["dim"]
    reference = BiLM.from_allennlp(
        allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5"
    )
    docs = synthetic_docs(nlp, 8, seed=5)
    nlp.to_disk(tmp_path / "again")
    again = spacy.load(tmp_path / "again")
    for gold in docs:
        words = [t.text for t in gold]
        doc_trained = nlp(Doc(nlp.vocab, words=words))
        expected = reference.embed([words])[0]
        np.testing.assert_allclose(doc_trained._.elmo_layers, expected, atol=1e-5, rtol=0)
        for other in (loaded, again):
            doc = other(Doc(other.vocab, words=words))
            np.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)
        doc = again(Doc(again.vocab, words=words))
        assert [t.tag_ for t in doc] == [t.tag_ for t in doc_trained]
    assert any(t.tag_ for t in doc_trained)


def test_given_values_are_checked_and_open_ones_filled(allennlp_fixture, data):
    config = only_the_files(allennlp_fixture, data)
    config["components"]["elmo"]["model"] = {
        "@architectures": "spacy_elmo.ElmoModel.v1",
        "lstm_dim": 64,  # right
        "projection_dim": 8,  # wrong: the fixture has 16
    }
    nlp = load_model_from_config(config, auto_fill=True)
    with pytest.raises(ValueError, match=r"lstm.projection_dim: config 8, weights 16"):
        nlp.initialize(lambda: _examples(nlp))
    config["components"]["elmo"]["model"]["projection_dim"] = 16
    nlp = load_model_from_config(config, auto_fill=True)
    nlp.initialize(lambda: _examples(nlp))
    assert nlp.get_pipe("elmo").model.get_dim("nO") == 32
    assert nlp.config["components"]["elmo"]["model"]["n_highway"] == 2


def test_listener_with_a_given_wrong_width_still_fails(allennlp_fixture, data):
    config = only_the_files(allennlp_fixture, data)
    config["components"]["tagger"]["model"]["tok2vec"]["width"] = 256
    nlp = load_model_from_config(config, auto_fill=True)
    with pytest.raises(ValueError, match="listener of 'tagger' has width=256"):
        nlp.initialize(lambda: _examples(nlp))


def test_default_component_takes_its_architecture_from_the_weights(bilm_dir, tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"set_tensor": True})
    nlp.config["initialize"]["components"]["elmo"] = {
        "weights": {"@misc": "spacy_elmo.SavedBiLM.v1", "path": str(bilm_dir)}
    }
    before = nlp.to_bytes()  # an open architecture serialises before it is known
    nlp.initialize()
    saved = json.loads((bilm_dir / "config.json").read_text())["options"]
    model = nlp.config["components"]["elmo"]["model"]
    assert model["lstm_dim"] == saved["lstm"]["dim"]
    assert model["filters"] == saved["char_cnn"]["filters"]
    words = ["the", "river", "bank"]
    doc = nlp(Doc(nlp.vocab, words=words))
    np.testing.assert_allclose(
        doc._.elmo_layers, BiLM.load(bilm_dir).embed([words])[0], atol=1e-5, rtol=0
    )
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    np.testing.assert_allclose(
        loaded(Doc(loaded.vocab, words=words))._.elmo_layers, doc._.elmo_layers, atol=1e-6
    )
    fresh = spacy.blank("en")
    fresh.add_pipe("elmo")
    fresh.from_bytes(before)
    assert not fresh.get_pipe("elmo").model.attrs["weights_loaded"]


def test_explicit_architecture_is_unchanged(bilm_dir):
    """A config that gives every value builds the biLM at once, as before."""
    nlp = tiny_nlp(bilm_dir, model={"activation": "relu", "cell_clip": 3.0, "proj_clip": 3.0,
                                    "use_skip_connections": True})  # fmt: skip
    model = nlp.get_pipe("elmo").model
    assert model.get_dim("nO") == 16 and model.get_dim("n_layers") == 3
    assert model.layers[0].shims[0]._model.options is not None


def _examples(nlp):
    return [
        Example(Doc(nlp.vocab, words=[t.text for t in d]), d)
        for d in synthetic_docs(nlp, 6, seed=2)
    ]
