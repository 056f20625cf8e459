"""Training with listeners: per-component mixes, frozen cache, fine-tuning, frozen upstream,
replace_listeners, and an end-to-end `spacy train` run."""

from __future__ import annotations

import math
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
import spacy
import torch
from spacy.training import Example
from spacy.util import load_model_from_config

from spacy_elmo import BiLM
from spacy_elmo.layers.elmo_model import get_bilm
from spacy_elmo.layers.scalar_mix import softmax_weights_and_gamma

from .pipeline_util import synthetic_docs, tiny_training_config, write_train_dev


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_train_dev(tmp_path_factory.mktemp("data"), 60, 20)


def make_nlp(bilm_dir, data, **elmo_model):
    config = tiny_training_config(bilm_dir, *data)
    config["components"]["elmo"]["model"].update(elmo_model)
    nlp = load_model_from_config(config, auto_fill=True)
    gold = synthetic_docs(nlp, 30, seed=2)
    examples = [Example(spacy.tokens.Doc(nlp.vocab, words=[t.text for t in d]), d) for d in gold]
    for eg in examples:
        eg.predicted[0].is_sent_start = True
    nlp.initialize(lambda: examples)
    return nlp, examples


def mixes(nlp, component):
    return [
        softmax_weights_and_gamma(node)
        for node in nlp.get_pipe(component).model.walk()
        if node.name == "scalar_mix"
    ]


@contextmanager
def counted_bilm_tokens():
    """A list whose one number counts the tokens that reach any biLM's forward pass from here
    on, by a forward hook on every torch module."""
    counter = [0]

    def count(module, args, output) -> None:
        if isinstance(module, BiLM):
            counter[0] += int(output.mask.sum())

    handle = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        yield counter
    finally:
        handle.remove()


def bilm_state(nlp):
    return {k: v.clone() for k, v in get_bilm(nlp.get_pipe("elmo").model).state_dict().items()}


def test_listeners_train_their_own_mixes_with_a_frozen_cached_bilm(bilm_dir, data):
    nlp, examples = make_nlp(bilm_dir, data)
    elmo = nlp.get_pipe("elmo")
    assert sorted(elmo.listening_components) == ["ner", "tagger"]
    before = bilm_state(nlp)
    optimizer = nlp.create_optimizer()
    optimizer.learn_rate = 0.05
    threads_seen = []

    def record_threads(module, args, output) -> None:
        if isinstance(module, BiLM):
            threads_seen.append(torch.get_num_threads())

    handle = torch.nn.modules.module.register_module_forward_hook(record_threads)
    with counted_bilm_tokens() as bilm_tokens:
        first = nlp.update(examples, sgd=optimizer)  # first epoch: the biLM runs on every one
        handle.remove()
        assert set(threads_seen) == {1}  # by default the biLM trains on one torch thread
        assert bilm_tokens == [sum(len(eg.predicted) for eg in examples)]
        for _ in range(5):
            losses = nlp.update(examples, sgd=optimizer)
        assert bilm_tokens == [sum(len(eg.predicted) for eg in examples)]  # later: the cache
    # The tagger learns the tags (its loss falls from about 125 to below 1); the parser-style
    # ner loss goes up and down on 30 sentences, but is there and finite, and its mix moves.
    assert 0 < losses["tagger"] < first["tagger"] / 10
    assert 0 < losses["ner"] < math.inf and 0 < first["ner"] < math.inf
    assert first["elmo"] == losses["elmo"] == 0.0  # nothing of a frozen biLM trains
    for key, value in bilm_state(nlp).items():
        assert torch.equal(value, before[key]), key  # frozen: no update of the biLM
    (tagger_s, _), (ner_s, _) = mixes(nlp, "tagger")[0], mixes(nlp, "ner")[0]
    assert not np.allclose(tagger_s, [1 / 3] * 3) and not np.allclose(ner_s, [1 / 3] * 3)
    assert not np.allclose(tagger_s, ner_s)


@pytest.mark.filterwarnings("error:grad and param do not obey:UserWarning")
def test_fine_tuning_updates_the_bilm(bilm_dir, data):
    nlp, examples = make_nlp(bilm_dir, data, frozen=False, grad_factor=2.0)
    before = bilm_state(nlp)
    optimizer = nlp.create_optimizer()
    with counted_bilm_tokens() as bilm_tokens:
        for _ in range(2):  # the upstream's update lags one step behind (spaCy's update order)
            losses = nlp.update(examples, sgd=optimizer)
    assert 0 < losses["elmo"] < math.inf  # the squared gradient that reaches the biLM
    changed = [k for k, v in bilm_state(nlp).items() if not torch.equal(v, before[k])]
    assert "forward_lstm.layers.1.recurrent_weight" in changed
    assert "char_cnn.char_embedding.weight" in changed
    # No cache when fine-tuning: every pass runs the biLM.
    assert bilm_tokens == [2 * sum(len(eg.predicted) for eg in examples)]


def test_listener_with_frozen_annotating_upstream(bilm_dir, data):
    nlp, examples = make_nlp(bilm_dir, data)
    before = bilm_state(nlp)
    optimizer = nlp.create_optimizer()
    for _ in range(3):
        losses = nlp.update(examples, sgd=optimizer, exclude=["elmo"], annotates=["elmo"])
    assert "elmo" not in losses and losses["tagger"] > 0
    for key, value in bilm_state(nlp).items():
        assert torch.equal(value, before[key])


def test_frozen_upstream_that_does_not_annotate_is_a_clear_error(bilm_dir, data):
    nlp, examples = make_nlp(bilm_dir, data)
    with pytest.raises(ValueError, match="elmo_layers is not set"):
        nlp.update(examples, exclude=["elmo"])


def test_replace_listeners_keeps_predictions_and_mix(bilm_dir, data, tmp_path):
    nlp, examples = make_nlp(bilm_dir, data)
    optimizer = nlp.create_optimizer()
    for _ in range(3):
        nlp.update(examples, sgd=optimizer)
    texts = [[t.text for t in eg.reference] for eg in examples[:5]]
    docs = [nlp(spacy.tokens.Doc(nlp.vocab, words=w)) for w in texts]
    tagger_mix = mixes(nlp, "tagger")[0]
    nlp.replace_listeners("elmo", "tagger", ["model.tok2vec.elmo"])
    assert nlp.get_pipe("elmo").listening_components == ["ner"]
    assert nlp.config["components"]["tagger"]["model"]["tok2vec"]["elmo"]["@architectures"] == (
        "spacy_elmo.ElmoMix.v1"
    )
    assert mixes(nlp, "tagger")[0] == tagger_mix
    again = [nlp(spacy.tokens.Doc(nlp.vocab, words=w)) for w in texts]
    assert [[t.tag_ for t in d] for d in docs] == [[t.tag_ for t in d] for d in again]
    nlp.to_disk(tmp_path / "replaced")
    loaded = spacy.load(tmp_path / "replaced")
    reloaded = [loaded(spacy.tokens.Doc(loaded.vocab, words=w)) for w in texts]
    assert [[t.tag_ for t in d] for d in docs] == [[t.tag_ for t in d] for d in reloaded]
    # The tagger now works without the elmo component.
    loaded.remove_pipe("elmo")
    loaded.remove_pipe("ner")
    alone = [loaded(spacy.tokens.Doc(loaded.vocab, words=w)) for w in texts]
    assert [[t.tag_ for t in d] for d in docs] == [[t.tag_ for t in d] for d in alone]


def test_spacy_train_end_to_end(bilm_dir, data, tmp_path):
    config = tiny_training_config(bilm_dir, *data, max_steps=80, eval_frequency=40)
    config.to_disk(tmp_path / "config.cfg")
    result = subprocess.run(
        [sys.executable, "-m", "spacy", "train", str(tmp_path / "config.cfg"),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    nlp = spacy.load(tmp_path / "out" / "model-last")
    docs = synthetic_docs(nlp, 20, seed=3)
    words = [[t.text for t in d] for d in docs]
    predicted = [nlp(spacy.tokens.Doc(nlp.vocab, words=w)) for w in words]
    accuracy = np.mean(
        [p.tag_ == g.tag_ for pd, gd in zip(predicted, docs) for p, g in zip(pd, gd)]
    )
    assert accuracy > 0.5  # the 7-tag synthetic grammar is learnt in 80 steps
    nlp.to_disk(tmp_path / "again")
    reloaded = spacy.load(tmp_path / "again")
    for w, before in zip(words, predicted):
        after = reloaded(spacy.tokens.Doc(reloaded.vocab, words=w))
        assert [t.tag_ for t in after] == [t.tag_ for t in before]
        assert [(e.start, e.end, e.label_) for e in after.ents] == [
            (e.start, e.end, e.label_) for e in before.ents
        ]
        np.testing.assert_allclose(after._.elmo_layers, before._.elmo_layers, atol=1e-6, rtol=0)
    assert mixes(nlp, "tagger")[0] != mixes(nlp, "ner")[0]


def test_listener_width_that_does_not_match_the_bilm_fails_at_initialize(bilm_dir, data):
    config = tiny_training_config(bilm_dir, *data)
    config["components"]["ner"]["model"]["tok2vec"]["elmo"]["width"] = 32
    nlp = load_model_from_config(config, auto_fill=True)
    gold = synthetic_docs(nlp, 5, seed=2)
    examples = [Example(spacy.tokens.Doc(nlp.vocab, words=[t.text for t in d]), d) for d in gold]
    with pytest.raises(ValueError, match="listener of 'ner' has width=32, n_layers=3 but"):
        nlp.initialize(lambda: examples)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_fine_tuned_bilm_predicts_with_its_new_weights(bilm_dir, data, overlap):
    """After `nlp.update` with the biLM fine-tuned, `nlp.pipe` gives the layers of a freshly
    loaded copy of the updated pipeline, overlapped or not: no char-CNN vector of the token
    cache (filled before the update) outlives the old weights."""
    before_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the overlap modes apply from two torch threads on
    try:
        nlp, examples = make_nlp(bilm_dir, data, frozen=False)
        elmo = nlp.get_pipe("elmo")
        elmo.cfg["overlap"] = overlap
        texts = [eg.reference.text for eg in examples[:12]]
        before = [doc._.elmo_layers.copy() for doc in nlp.pipe(texts, batch_size=4)]
        optimizer = nlp.create_optimizer()
        optimizer.learn_rate = 0.02  # steps that move the layers well beyond float rounding
        for _ in range(2):  # the upstream's update lags one step behind
            nlp.update(examples, sgd=optimizer)
        after = [doc._.elmo_layers for doc in nlp.pipe(texts, batch_size=4)]
        fresh = load_model_from_config(nlp.config, auto_fill=True)
        fresh.from_bytes(nlp.to_bytes())
        fresh.get_pipe("elmo").cfg["overlap"] = False
        expected = [doc._.elmo_layers for doc in fresh.pipe(texts, batch_size=4)]
    finally:
        torch.set_num_threads(before_threads)
    moved = max(float(np.abs(a[0] - b[0]).max()) for a, b in zip(after, before))
    assert moved > 1e-4  # layer 0 (the char CNN's) moved well beyond the tolerance below
    for got, want in zip(after, expected):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
