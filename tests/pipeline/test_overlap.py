"""The `elmo` component's `overlap` setting (`pipeline/overlap.py`): `nlp.pipe` with the biLM one
batch ahead in a background thread gives the docs in order with the layers of the component
run in turn on one torch thread fewer, bit for bit; errors reach the error handler batch by
batch; torch's thread setting comes back, however the iteration ends."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

from spacy_elmo.bilm import fast_paths
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
    elmo.predict = lambda docs: predicted_in.append(threading.current_thread()) or predict(docs)
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
        elmo.quantize = "bf16"  # bfloat16 steps run in the compiled loop too
        assert overlap_applies(elmo)
    monkeypatch.setattr(fast_paths, "COMPILED_STEPS", False)  # steps in Python: in turn
    assert not overlap_applies(elmo)
    monkeypatch.setattr(fast_paths, "COMPILED_STEPS", True)
    elmo.quantize = None
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

    def failing(docs):
        if any("Berlin" in doc.text for doc in docs):
            raise ValueError("a batch with Berlin")
        return predict(docs)

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


def test_stopping_early_stops_the_background_thread(bilm_dir, threads):
    nlp = tiny_nlp(bilm_dir)
    nlp.initialize()
    torch.set_num_threads(2)
    before = {t.name for t in threading.enumerate()}
    docs = nlp.pipe(TEXTS, batch_size=2)
    first = [next(docs) for _ in range(3)]
    assert first[0]._.elmo_layers.shape[1] == len(first[0])
    assert any(t.name.startswith("elmo-bilm") for t in threading.enumerate())
    docs.close()
    assert {t.name for t in threading.enumerate()} == before
    assert torch.get_num_threads() == 2
