"""No silent waste, no dead ends: an `elmo` that no trained component listens to warns; a
listener without upstream output gives zeros at inference and fails in training."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import spacy
from spacy.tokens import Doc
from spacy.training import Example
from spacy.util import load_model_from_config

from spacy_elmo.layers.listener import ElmoLayersListener, ElmoListenerWarning
from spacy_elmo.pipeline.component import ElmoUnusedWarning

from .pipeline_util import TINY_WIDTH, synthetic_docs, tiny_nlp, tiny_training_config


def examples_for(nlp, n=6):
    gold = synthetic_docs(nlp, n, seed=2)
    return [Example(Doc(nlp.vocab, words=[t.text for t in d]), d) for d in gold]


@pytest.fixture(scope="module")
def trained(bilm_dir, tmp_path_factory):
    config = tiny_training_config(bilm_dir, "unused", "unused")
    nlp = load_model_from_config(config, auto_fill=True)
    examples = examples_for(nlp, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElmoUnusedWarning)  # two listeners: no warning
        optimizer = nlp.initialize(lambda: examples)
    for _ in range(3):
        nlp.update(examples, sgd=optimizer)
    return nlp, examples


def test_elmo_that_nobody_uses_warns_at_initialize(bilm_dir):
    nlp = tiny_nlp(bilm_dir, pipeline=("elmo", "tagger"))  # a tagger on its own tok2vec
    with pytest.warns(ElmoUnusedWarning, match=r"nothing listens.*training 'tagger' runs"):
        nlp.initialize(lambda: examples_for(nlp))
    nlp = tiny_nlp(bilm_dir, pipeline=("elmo", "tagger"), set_tensor=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElmoUnusedWarning)
        nlp.initialize(lambda: examples_for(nlp))  # doc.tensor is a use


def test_elmo_alone_does_not_warn_at_initialize(bilm_dir):
    """A pipeline whose only trainable component is elmo is run for its layers: no warning."""
    nlp = tiny_nlp(bilm_dir, pipeline=("elmo", "sentencizer"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElmoUnusedWarning)
        nlp.initialize()
    assert nlp("Anna visited Paris.")._.elmo_layers.shape[1] == 4


def test_listener_without_upstream_output_gives_zeros_at_inference(trained):
    nlp, _ = trained
    words = ["Anna", "visited", "Paris", "."]
    (listener,) = [
        n for n in nlp.get_pipe("tagger").model.walk() if isinstance(n, ElmoLayersListener)
    ]
    with pytest.warns(ElmoListenerWarning, match="uses zeros: the 'elmo' component did not run"):
        (zeros,) = listener.predict([Doc(nlp.vocab, words=words)])
    assert zeros.shape == (3, 4, TINY_WIDTH) and not zeros.any()
    with nlp.select_pipes(disable=["elmo"]):
        with pytest.warns(ElmoListenerWarning):
            doc = nlp(Doc(nlp.vocab, words=words))
    assert doc._.elmo_layers is None and len(doc) == 4
    # With the upstream, the listener reads the layers the elmo component set.
    doc = nlp(Doc(nlp.vocab, words=words))
    (layers,) = listener.predict([doc])
    np.testing.assert_array_equal(layers, doc._.elmo_layers)
    assert layers.any()


def test_zeros_warn_right_after_initialize(bilm_dir):
    nlp = load_model_from_config(tiny_training_config(bilm_dir, "-", "-"), auto_fill=True)
    nlp.initialize(lambda: examples_for(nlp))
    with nlp.select_pipes(disable=["elmo"]):
        with pytest.warns(ElmoListenerWarning):
            nlp("Anna visited Paris.")


def test_listener_without_upstream_output_fails_in_training(trained):
    nlp, examples = trained
    with pytest.raises(ValueError, match="elmo_layers is not set"):
        nlp.get_pipe("tagger").update(examples)
    with pytest.raises(ValueError, match="elmo_layers is not set"):
        nlp.update(examples, exclude=["elmo"])


def test_listener_width_unknown_without_upstream_is_a_clear_error(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe(
        "tagger",
        config={
            "model": {
                "@architectures": "spacy.Tagger.v2",
                "tok2vec": {"@architectures": "spacy_elmo.ElmoListener.v1", "upstream": "elmo"},
            }
        },
    )
    with pytest.raises(ValueError, match="has no width yet: it is taken from the upstream"):
        nlp.initialize(lambda: examples_for(nlp))


def test_spacy_elmo_debug_model_traces_a_listening_component(bilm_dir, tmp_path):
    """spaCy's `debug model` updates the analysed component alone, so a listener gets no
    layers in its training step; `spacy-elmo debug-model` runs the elmo upstream first."""
    from typer.testing import CliRunner

    from spacy_elmo.cli import app

    from .pipeline_util import write_train_dev

    train, dev = write_train_dev(tmp_path, 10, 4)
    tiny_training_config(bilm_dir, train, dev).to_disk(tmp_path / "config.cfg")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ElmoListenerWarning)  # real layers, never zeros
        result = CliRunner().invoke(
            app, ["debug-model", str(tmp_path / "config.cfg"), "ner", "-P3", "-DIM"]
        )
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "'ner' listens to elmo: updated first" in result.output
    assert "Successfully ended analysis" in result.output
