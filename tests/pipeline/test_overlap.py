"""The `elmo` component's `overlap` setting (`pipeline/overlap.py`): `nlp.pipe` with the biLM one
batch ahead in a background thread gives the docs in order with the layers of the component
run in turn on one torch thread fewer, bit for bit; errors reach the error handler batch by
batch; torch's thread setting comes back, however the iteration ends; a call that fails or is
abandoned leaves nothing in flight, and calls side by side each give their docs their own
layers."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest
import torch
from spacy.language import Language

from spacy_elmo.bilm import lstm
from spacy_elmo.bilm.quantize import Bf16SpeedWarning
from spacy_elmo.pipeline.overlap import overlap_applies

from .pipeline_util import tiny_nlp

TEXTS = [
    "Anna visited Paris in May .",
    "",  # an empty doc
    "The bank left a river behind , said Ben .",
    "   ",  # whitespace only
    "Berlin likes the bank . Ben left .",
    "東京 is big 🙂 .",
    "a " * 60,
] * 3


@pytest.fixture()
def threads():
    """torch's thread setting, put back after the test."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def annotate(nlp, overlap: bool, batch_size: int = 4):
    elmo = nlp.get_pipe("elmo")
    elmo.cfg["overlap"] = overlap
    return list(nlp.pipe(TEXTS, batch_size=batch_size))


@pytest.mark.parametrize("torch_threads", [2, 3])
def test_overlapped_pipe_equals_the_component_in_turn(bilm_dir, threads, torch_threads):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    torch.set_num_threads(torch_threads - 1)
    in_turn = annotate(nlp, overlap=False)
    torch.set_num_threads(torch_threads)
    predicted_in = []
    elmo = nlp.get_pipe("elmo")
    predict = elmo.predict
    elmo.predict = lambda docs, **kwargs: (
        predicted_in.append(threading.current_thread()) or predict(docs, **kwargs)
    )
    overlapped = annotate(nlp, overlap=True)
    assert torch.get_num_threads() == torch_threads  # put back
    assert len(predicted_in) == 6 and threading.current_thread() not in predicted_in
    assert [doc.text for doc in overlapped] == TEXTS
    for a, b in zip(in_turn, overlapped):
        np.testing.assert_array_equal(a._.elmo_layers, b._.elmo_layers)
        assert a._.elmo_mix_coefficients == b._.elmo_mix_coefficients


def test_overlap_applies_on_the_cpu_with_two_threads_or_more(bilm_dir, threads, monkeypatch):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    elmo = nlp.get_pipe("elmo")
    assert elmo.cfg["overlap"] is True  # the default
    torch.set_num_threads(2)
    assert overlap_applies(elmo)
    torch.set_num_threads(1)  # e.g. each process of nlp.pipe(n_process=N)
    assert not overlap_applies(elmo)
    torch.set_num_threads(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Bf16SpeedWarning)
        elmo.cfg["quantize"] = "bf16"  # bfloat16 steps run in the compiled loop too
        assert overlap_applies(elmo)
    monkeypatch.setattr(lstm, "COMPILED_STEPS", False)  # steps in Python: in turn
    assert not overlap_applies(elmo)
    monkeypatch.setattr(lstm, "COMPILED_STEPS", True)
    elmo.cfg["quantize"] = None
    assert overlap_applies(elmo)
    elmo.cfg["overlap"] = False
    assert not overlap_applies(elmo)
    off = tiny_nlp(bilm_dir, overlap=False)
    assert off.get_pipe("elmo").cfg["overlap"] is False
    assert off.config["components"]["elmo"]["overlap"] is False


def test_errors_reach_the_error_handler_batch_by_batch(bilm_dir, threads):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    torch.set_num_threads(2)
    elmo = nlp.get_pipe("elmo")
    predict = elmo.predict

    def failing(docs, **kwargs):
        if any("Berlin" in doc.text for doc in docs):
            raise ValueError("a batch with Berlin")
        return predict(docs, **kwargs)

    elmo.predict = failing
    with pytest.raises(ValueError, match="a batch with Berlin"):
        annotate(nlp, overlap=True)
    assert torch.get_num_threads() == 2
    failed = []
    nlp.set_error_handler(lambda name, component, docs, error: failed.append(len(docs)))
    done = annotate(nlp, overlap=True, batch_size=4)
    # 21 docs in batches of 4: the batches holding a "Berlin" doc (docs 4, 11, 18) are left out
    assert failed == [4, 4, 4]
    assert len(done) == len(TEXTS) - 12
    assert all(doc._.elmo_layers is not None for doc in done)


def test_stopping_early_leaves_no_background_thread(bilm_dir, threads):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    torch.set_num_threads(2)
    before = {t.name for t in threading.enumerate()}
    docs = nlp.pipe(TEXTS, batch_size=2)
    first = [next(docs) for _ in range(3)]
    assert first[0]._.elmo_layers.shape[1] == len(first[0])
    docs.close()
    assert {t.name for t in threading.enumerate()} == before
    assert torch.get_num_threads() == 2


# Texts of the same length, whose layers differ: a doc given another's layers would pass the
# shape check and show here.
SAME_LENGTH = [
    f"{name} visited {place} in {month} ."
    for name, place, month in [
        ("Anna", "Paris", "May"),
        ("Ben", "Rome", "June"),
        ("Clara", "Oslo", "July"),
        ("Dan", "Lima", "March"),
        ("Eva", "Kyiv", "April"),
        ("Finn", "Bern", "August"),
    ]
]


def assert_own_layers(nlp, docs, texts) -> None:
    """Each doc holds the layers of `nlp(text)` of its own text (in turn; float rounding)."""
    assert [doc.text for doc in docs] == list(texts)
    for doc, text in zip(docs, texts):
        np.testing.assert_allclose(doc._.elmo_layers, nlp(text)._.elmo_layers, atol=1e-5, rtol=0)


def bilm_threads_running() -> list:
    """The biLM threads still running once the batch ahead had time to finish."""
    running = [t for t in threading.enumerate() if t.name.startswith("elmo-bilm")]
    assert len(running) <= 1  # at most the one batch ahead
    for thread in running:
        thread.join(timeout=60)
    return [t for t in running if t.is_alive()]


@Language.component("fails_on_rome")
def fails_on_rome(doc):
    if "Rome" in doc.text:
        raise RuntimeError("a later component failed")
    return doc


def test_a_failed_call_leaves_nothing_in_flight_and_the_next_gets_its_own_layers(bilm_dir, threads):
    """A later component raises inside `nlp.pipe`, the caller catches it: no biLM work of that
    call is left running, and the next call's docs get the layers of their own texts."""
    nlp = tiny_nlp(bilm_dir)
    nlp.add_pipe("fails_on_rome")
    nlp.initialize()
    torch.set_num_threads(2)
    assert overlap_applies(nlp.get_pipe("elmo"))
    with pytest.raises(RuntimeError, match="a later component failed"):
        list(nlp.pipe(SAME_LENGTH, batch_size=1))
    assert bilm_threads_running() == []
    texts = [text for text in SAME_LENGTH if "Rome" not in text]
    assert_own_layers(nlp, list(nlp.pipe(texts, batch_size=1)), texts)
    # abandoned after one doc: stopped when the caller drops it
    docs = nlp.pipe(texts, batch_size=1)
    next(docs)
    del docs
    assert bilm_threads_running() == []
    assert_own_layers(nlp, list(nlp.pipe(texts[::-1], batch_size=2)), texts[::-1])


def test_calls_side_by_side_give_every_doc_its_own_layers(bilm_dir, threads):
    """`zip(nlp.pipe(a), nlp.pipe(b))`: two calls in flight at once, each doc its own layers."""
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    torch.set_num_threads(2)
    assert overlap_applies(nlp.get_pipe("elmo"))
    a, b = SAME_LENGTH[:3], SAME_LENGTH[3:]
    pairs = list(zip(nlp.pipe(a, batch_size=1), nlp.pipe(b, batch_size=1)))
    assert_own_layers(nlp, [first for first, _ in pairs], a)
    assert_own_layers(nlp, [second for _, second in pairs], b)
    assert bilm_threads_running() == []


def test_one_batch_is_predicted_at_a_time(bilm_dir, threads):
    """The batch ahead starts once the one before it is predicted: two predictions at once
    would hold two batches' layers and share the cores."""
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    torch.set_num_threads(2)
    elmo = nlp.get_pipe("elmo")
    predict = elmo.predict
    running, most = [], []

    def slow_predict(docs, **kwargs):
        running.append(docs)
        most.append(len(running))
        time.sleep(0.05)  # slower than the caller, who takes the docs at once
        try:
            return predict(docs, **kwargs)
        finally:
            running.remove(docs)

    elmo.predict = slow_predict
    assert overlap_applies(elmo)
    docs = annotate(nlp, overlap=True, batch_size=2)
    assert len(docs) == len(TEXTS)
    assert len(most) == -(-len(TEXTS) // 2)  # every batch predicted once
    assert max(most) == 1
