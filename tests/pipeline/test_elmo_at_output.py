"""ElmoTok2Vec.v2: the mixed ELMo vector at the encoder's input and, with elmo_at_output, at
its output too ([encode(Maxout([x_k; ELMo_k])); ELMo_k]); elmo_dropout on the mixed vector."""

from __future__ import annotations

import numpy as np
import pytest
import spacy
from spacy.training import Example
from spacy.util import load_model_from_config, registry
from thinc.api import Linear, concatenate, set_dropout_rate

from spacy_elmo.layers.leading_columns import leading_columns
from spacy_elmo.layers.own_dropout import own_dropout
from spacy_elmo.layers.scalar_mix import softmax_weights_and_gamma
from spacy_elmo.pipeline.architectures import ElmoTok2Vec, ElmoTok2Vec_v2

from .pipeline_util import TINY_WIDTH, synthetic_docs, tiny_training_config, write_train_dev


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_train_dev(tmp_path_factory.mktemp("data"), 40, 10)


def make_nlp(bilm_dir, data, elmo_at_output=True, elmo_dropout=0.0):
    """The tiny training pipeline with both tok2vecs ElmoTok2Vec.v2; the tagger's mix without
    layer norm or dropout, so that a NumPy mix of doc._.elmo_layers is its reference."""
    config = tiny_training_config(bilm_dir, *data)
    for name in ("tagger", "ner"):
        tok2vec = config["components"][name]["model"]["tok2vec"]
        tok2vec["@architectures"] = "spacy_elmo.ElmoTok2Vec.v2"
        tok2vec["elmo_at_output"] = elmo_at_output
        tok2vec["elmo_dropout"] = elmo_dropout
    config["components"]["tagger"]["model"]["tok2vec"]["elmo"].update(
        {"layer_norm": False, "layer_dropout": 0.0, "initial_weights": [0.3, -0.2, 0.5]}
    )
    nlp = load_model_from_config(config, auto_fill=True)
    gold = synthetic_docs(nlp, 20, seed=2)
    examples = [Example(spacy.tokens.Doc(nlp.vocab, words=[t.text for t in d]), d) for d in gold]
    nlp.initialize(lambda: examples)
    return nlp, examples


def tok2vec_outputs(nlp, component, docs):
    return nlp.get_pipe(component).model.get_ref("tok2vec").predict(docs)


def test_leading_columns_forward_and_backward_against_numpy():
    source = Linear(3, 2)
    layer = leading_columns(source)
    assert layer.get_dim("nO") == 3
    X = np.arange(20, dtype="f").reshape(4, 5)
    Y, backprop = layer(X, is_train=True)
    np.testing.assert_array_equal(Y, X[:, :3])
    dY = np.ones((4, 3), dtype="f") * 2
    expected = np.zeros((4, 5), dtype="f")
    expected[:, :3] = 2
    np.testing.assert_array_equal(backprop(dY), expected)
    with pytest.raises(ValueError, match="2 columns, fewer than 3"):
        layer(X[:, :2], is_train=False)


def test_leading_columns_reads_an_inferred_width_at_initialize():
    source = Linear()
    layer = leading_columns(source)
    assert not layer.has_dim("nO")
    source.initialize(X=np.zeros((2, 4), dtype="f"), Y=np.zeros((2, 6), dtype="f"))
    layer.initialize(X=np.zeros((2, 9), dtype="f"))
    assert layer.get_dim("nO") == 6


def test_gradient_through_the_output_concatenation_matches_finite_differences():
    """d/dX of sum(R * [Linear(X); X[:, :3]]): backprop against central differences."""
    rng = np.random.default_rng(0)
    inner = Linear(4, 5)
    model = concatenate(inner, leading_columns(Linear(3, 1)))
    X = rng.normal(size=(6, 5)).astype("f")
    model.initialize(X=X)
    R = rng.normal(size=(6, 7)).astype("f")
    Y, backprop = model(X, is_train=True)
    assert Y.shape == (6, 7)
    analytic = backprop(R)
    numeric = np.zeros_like(X)
    eps = 1e-2
    for index in np.ndindex(*X.shape):
        plus, minus = X.copy(), X.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = ((model.predict(plus) * R).sum() - (model.predict(minus) * R).sum()) / (
            2 * eps
        )
    np.testing.assert_allclose(analytic, numeric, rtol=1e-3, atol=1e-3)


def test_without_output_elmo_v2_is_v1():
    encode = registry.resolve(
        {
            "e": {
                "@architectures": "spacy.MaxoutWindowEncoder.v2",
                "width": 8,
                "depth": 1,
                "window_size": 1,
                "maxout_pieces": 2,
            }
        }
    )["e"]
    v1 = ElmoTok2Vec(Linear(4), Linear(4), encode)
    v2 = ElmoTok2Vec_v2(Linear(4), Linear(4), encode, elmo_at_output=False)
    assert [node.name for node in v1.walk()] == [node.name for node in v2.walk()]
    with_output = ElmoTok2Vec_v2(Linear(4), Linear(4), encode, elmo_at_output=True)
    assert with_output.get_dim("nO") == 8 + 4
    assert "leading_columns" in [node.name for node in with_output.walk()]


def test_output_columns_are_the_components_own_numpy_mix(bilm_dir, data):
    nlp, examples = make_nlp(bilm_dir, data)
    optimizer = nlp.create_optimizer()
    for _ in range(2):
        nlp.update(examples, sgd=optimizer)
    docs = list(nlp.pipe([eg.reference.text for eg in examples[:4]], disable=["tagger", "ner"]))
    outputs = tok2vec_outputs(nlp, "tagger", docs)
    mix = [node for node in nlp.get_pipe("tagger").model.walk() if node.name == "scalar_mix"][0]
    weights, gamma = softmax_weights_and_gamma(mix)
    assert weights != pytest.approx(softmax([0.3, -0.2, 0.5]))  # it trained
    encoder_width = nlp.config["components"]["tagger"]["model"]["tok2vec"]["encode"]["width"]
    for doc, output in zip(docs, outputs):
        layers = np.asarray(doc._.elmo_layers)
        expected = gamma * np.einsum("l,lnd->nd", np.asarray(weights), layers)
        assert output.shape == (len(doc), encoder_width + TINY_WIDTH)
        np.testing.assert_allclose(output[:, encoder_width:], expected, rtol=1e-5, atol=1e-6)


def softmax(values):
    exp = np.exp(np.asarray(values) - max(values))
    return list(exp / exp.sum())


def test_trains_saves_loads_and_replaces_listeners(bilm_dir, data, tmp_path):
    nlp, examples = make_nlp(bilm_dir, data)
    optimizer = nlp.create_optimizer()
    losses = {}
    for _ in range(4):
        nlp.update(examples, sgd=optimizer, losses=losses)
    assert np.isfinite(losses["tagger"]) and np.isfinite(losses["ner"])
    words = [[t.text for t in eg.reference] for eg in examples[:5]]

    def annotate(pipeline):
        docs = [pipeline(spacy.tokens.Doc(pipeline.vocab, words=w)) for w in words]
        return [[(t.tag_, t.ent_iob_, t.ent_type_) for t in doc] for doc in docs]

    before = annotate(nlp)
    nlp.to_disk(tmp_path / "saved")
    assert annotate(spacy.load(tmp_path / "saved")) == before
    nlp.replace_listeners("elmo", "tagger", ["model.tok2vec.elmo"])
    assert annotate(nlp) == before
    nlp.to_disk(tmp_path / "replaced")
    assert annotate(spacy.load(tmp_path / "replaced")) == before


def test_encoder_and_elmo_both_reach_the_tagger(bilm_dir, data):
    """The tagger's softmax reads encoder_width + elmo width columns."""
    nlp, _ = make_nlp(bilm_dir, data)
    softmax_layer = nlp.get_pipe("tagger").model.layers[-1]
    encoder_width = nlp.config["components"]["tagger"]["model"]["tok2vec"]["encode"]["width"]
    assert softmax_layer.get_dim("nI") == encoder_width + TINY_WIDTH
    plain, _ = make_nlp(bilm_dir, data, elmo_at_output=False)
    assert plain.get_pipe("tagger").model.layers[-1].get_dim("nI") == encoder_width


def test_own_dropout_keeps_its_rate_and_scales_what_it_keeps():
    layer = own_dropout(0.25)
    set_dropout_rate(layer, 0.1)  # what spaCy's update does with --training.dropout
    assert layer.attrs["own_dropout_rate"] == 0.25
    X = np.ones((400, 50), dtype="f")
    np.testing.assert_array_equal(layer.predict(X), X)
    Y, backprop = layer(X, is_train=True)
    assert set(np.unique(Y)) == {0.0, np.float32(1 / 0.75)}
    assert abs((Y == 0).mean() - 0.25) < 0.02
    dY = np.arange(X.size, dtype="f").reshape(X.shape)
    np.testing.assert_allclose(backprop(dY), dY * Y)  # the same mask, the same scale


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_elmo_dropout_out_of_range_is_a_clear_error(rate):
    with pytest.raises(ValueError, match=f"elmo_dropout must be in \\[0, 1\\), got {rate}"):
        ElmoTok2Vec_v2(Linear(4), Linear(4), Linear(8, 8), elmo_dropout=rate)


def test_elmo_dropout_reaches_only_the_elmo_columns_in_training(bilm_dir, data):
    nlp, examples = make_nlp(bilm_dir, data, elmo_at_output=False, elmo_dropout=0.5)
    tok2vec = nlp.get_pipe("tagger").model.get_ref("tok2vec")
    dropouts = [node for node in tok2vec.walk() if node.name == "own_dropout"]
    assert len(dropouts) == 1 and dropouts[0].attrs["own_dropout_rate"] == 0.5
    docs = [eg.predicted for eg in examples[:3]]
    docs = list(nlp.get_pipe("elmo").pipe(docs))
    assert [a.tolist() for a in tok2vec.predict(docs)] == [
        a.tolist() for a in tok2vec.predict(docs)
    ]
    first, _ = tok2vec(docs, is_train=True)
    second, _ = tok2vec(docs, is_train=True)
    assert any(not np.allclose(a, b) for a, b in zip(first, second))  # new masks each time
    dropouts[0].attrs["own_dropout_rate"] = 0.0  # then nothing else in it is random
    first, _ = tok2vec(docs, is_train=True)
    second, _ = tok2vec(docs, is_train=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    dropouts[0].attrs["own_dropout_rate"] = 0.5
    losses = {}
    nlp.update(examples, sgd=nlp.create_optimizer(), losses=losses)
    assert np.isfinite(losses["tagger"]) and np.isfinite(losses["ner"])
