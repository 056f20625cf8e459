"""The `elmo` component's `overlap = "process"` (`pipeline/bilm_process.py`): `nlp.pipe` with the
biLM in a child process gives the docs in order with the layers of the component run in turn on
one torch thread fewer, bit for bit; the child is kept while the model and settings stay, and
started afresh when they change; errors reach the error handler batch by batch; a child that
dies is reported and replaced; an iteration stopped early leaves nothing behind for the next;
the child ends with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from spacy_elmo.layers.elmo_model import get_bilm
from spacy_elmo.layers.sentence_units import Unit
from spacy_elmo.pipeline import bilm_process
from spacy_elmo.pipeline.bilm_process import BiLMProcess, BiLMProcessError
from spacy_elmo.pipeline.overlap import overlap_way

from .pipeline_util import tiny_nlp
from .test_overlap import TEXTS

pytestmark = pytest.mark.skipif(not bilm_process.SUPPORTED, reason="POSIX pipes only")


@pytest.fixture()
def threads():
    """Two torch threads (the child gets one), the setting put back after the test."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


@pytest.fixture()
def nlp(bilm_dir):
    nlp = tiny_nlp(bilm_dir, overlap="process")
    nlp.initialize()
    yield nlp
    worker = nlp.get_pipe("elmo").started_bilm_process
    if worker is not None:
        worker.close()


def in_turn(nlp, threads: int, texts=TEXTS):
    """Each doc's layers from the component in turn on `threads` torch threads."""
    elmo = nlp.get_pipe("elmo")
    before, setting = torch.get_num_threads(), elmo.cfg["overlap"]
    torch.set_num_threads(threads)
    elmo.cfg["overlap"] = False
    try:
        return [doc._.elmo_layers for doc in nlp.pipe(texts, batch_size=4)]
    finally:
        torch.set_num_threads(before)
        elmo.cfg["overlap"] = setting


def assert_same_layers(docs, layers, texts=TEXTS, atol=0.0):
    """The docs' texts, and their layers equal to `layers` bit for bit, or within `atol`."""
    assert [doc.text for doc in docs] == texts
    for doc, expected in zip(docs, layers):
        assert doc._.elmo_layers.shape == (expected.shape[0], len(doc), expected.shape[2])
        if atol:
            np.testing.assert_allclose(doc._.elmo_layers, expected, rtol=0, atol=atol)
        else:
            np.testing.assert_array_equal(doc._.elmo_layers, expected)


def test_process_pipe_equals_the_component_in_turn(nlp, threads):
    elmo = nlp.get_pipe("elmo")
    assert overlap_way(elmo) == "process"
    expected = in_turn(nlp, threads=1)
    docs = list(nlp.pipe(TEXTS, batch_size=4))
    worker = elmo.started_bilm_process
    assert worker.process.pid != os.getpid() and worker.alive and worker.in_flight == 0
    assert_same_layers(docs, expected)
    assert docs[1]._.elmo_layers.shape[1] == 0  # the empty doc
    assert not docs[3]._.elmo_layers.any()  # whitespace tokens: zero vectors
    assert torch.get_num_threads() == threads  # the caller's setting is not touched
    again = list(nlp.pipe(TEXTS, batch_size=4))  # the same child, kept
    assert elmo.started_bilm_process is worker
    assert_same_layers(again, expected)


def test_a_changed_model_or_setting_reaches_the_running_process(nlp, threads):
    """New weights (in place, or a fine-tuning step that torch's versions miss) and a new
    thread count are loaded into the running child: no restart, the layers of the new model."""
    elmo = nlp.get_pipe("elmo")
    list(nlp.pipe(TEXTS[:2]))
    first = elmo.started_bilm_process
    pid = first.process.pid
    bilm = get_bilm(elmo.model)
    with torch.no_grad():
        next(bilm.parameters()).mul_(1.5)  # bumps the tensor's version
    expected = in_turn(nlp, threads=1)
    assert_same_layers(list(nlp.pipe(TEXTS, batch_size=4)), expected)
    with torch.no_grad():
        next(bilm.parameters()).data.mul_(0.5)  # unseen by the version: the step's way
    bilm.weights_changed()
    expected = in_turn(nlp, threads=1)
    assert_same_layers(list(nlp.pipe(TEXTS, batch_size=4)), expected)
    torch.set_num_threads(3)  # the child would run on 2
    list(nlp.pipe(TEXTS[:2]))
    assert elmo.started_bilm_process is first and first.alive and first.process.pid == pid
    assert first.key[-1] == 2


def test_errors_reach_the_error_handler_batch_by_batch(nlp, threads, monkeypatch):
    from spacy_elmo.pipeline import overlap

    model_units = overlap.model_units

    def failing(model, docs):  # cutting a batch into units fails here, in the caller
        if any("Berlin" in doc.text for doc in docs):
            raise ValueError("a batch with Berlin")
        return model_units(model, docs)

    monkeypatch.setattr(overlap, "model_units", failing)
    with pytest.raises(ValueError, match="a batch with Berlin"):
        list(nlp.pipe(TEXTS, batch_size=4))
    failed = []
    nlp.set_error_handler(lambda name, component, docs, error: failed.append(len(docs)))
    done = list(nlp.pipe(TEXTS, batch_size=4))
    assert failed == [4, 4, 4] and len(done) == len(TEXTS) - 12
    monkeypatch.setattr(overlap, "model_units", model_units)
    # The kept child ran the batches the errors cut short or skipped, so its token cache was
    # filled in another order than in turn's, each word's char-CNN vector computed beside other
    # words: equal within float rounding (seen at 6e-8), not bit for bit.
    assert_same_layers(list(nlp.pipe(TEXTS, batch_size=4)), in_turn(nlp, threads=1), atol=1e-6)


def test_an_error_in_the_child_comes_back_with_its_batch(nlp, threads):
    elmo = nlp.get_pipe("elmo")
    worker = BiLMProcess(elmo.model, None, 1, slots=2)
    try:
        worker.submit([Unit(3, [0], ("Anna",))], [1])  # doc 3 of a batch of one
        worker.submit([Unit(0, [0, 1], ("Anna", "left"))], [2])
        with pytest.raises(BiLMProcessError, match="2 batches in flight already"):
            worker.submit([Unit(0, [0], ("Anna",))], [1])  # its slot holds unread layers
        with pytest.raises(IndexError):
            worker.result()
        (layers,) = worker.result()  # the next batch is unaffected
        expected = elmo.model.predict([nlp.make_doc("Anna left")])[0]
        np.testing.assert_allclose(layers, expected, rtol=1e-5, atol=1e-6)
        with pytest.raises(BiLMProcessError, match="no batch in flight"):
            worker.result()
    finally:
        worker.close()
    assert worker.process.poll() is not None and not worker.alive


def test_a_child_that_dies_is_reported_and_replaced(nlp, threads):
    elmo = nlp.get_pipe("elmo")
    list(nlp.pipe(TEXTS[:2]))
    dead = elmo.started_bilm_process
    os.kill(dead.process.pid, signal.SIGKILL)
    with pytest.raises(BiLMProcessError, match=r"went away \(exit status -9\)"):
        list(nlp.pipe(TEXTS, batch_size=4))
    docs = list(nlp.pipe(TEXTS, batch_size=4))  # a new child
    assert elmo.started_bilm_process is not dead
    assert_same_layers(docs, in_turn(nlp, threads=1))


def test_stopping_early_leaves_no_reply_behind(nlp, threads):
    elmo = nlp.get_pipe("elmo")
    docs = nlp.pipe(TEXTS, batch_size=4)
    first = [next(docs) for _ in range(5)]  # batches 3 and 4 are in flight
    assert elmo.started_bilm_process.in_flight > 0
    docs.close()
    worker = elmo.started_bilm_process
    assert worker.in_flight == 0 and worker.alive
    expected = in_turn(nlp, threads=1)
    for doc, layers in zip(first, expected):
        np.testing.assert_array_equal(doc._.elmo_layers, layers)
    assert_same_layers(list(nlp.pipe(TEXTS, batch_size=4)), expected)
    assert elmo.started_bilm_process is worker


def test_where_the_process_applies_and_bad_settings(bilm_dir, threads):
    nlp = tiny_nlp(bilm_dir, overlap="process")
    nlp.initialize()
    elmo = nlp.get_pipe("elmo")
    assert nlp.config["components"]["elmo"]["overlap"] == "process"
    assert overlap_way(elmo) == "process"
    torch.set_num_threads(1)  # e.g. each process of nlp.pipe(n_process=N): in turn
    assert overlap_way(elmo) is None
    torch.set_num_threads(2)
    elmo.cfg["overlap"] = "thread"
    assert overlap_way(elmo) == "thread"
    with pytest.raises(ValueError, match=r"overlap of the 'elmo' component .*'proces'"):
        tiny_nlp(bilm_dir, overlap="proces")


def test_the_child_ends_with_its_parent(bilm_dir, tmp_path):
    script = textwrap.dedent(
        f"""
        import os, sys, torch
        sys.path.insert(0, {os.getcwd()!r})
        from tests.pipeline.pipeline_util import tiny_nlp
        torch.set_num_threads(2)
        nlp = tiny_nlp(__import__("pathlib").Path({str(bilm_dir)!r}), overlap="process")
        nlp.initialize()
        list(nlp.pipe(["Anna left ."]))
        print(nlp.get_pipe("elmo").started_bilm_process.process.pid, flush=True)
        os._exit(0)  # no clean-up: the child must see its pipe end
        """
    )
    parent = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert parent.returncode == 0, parent.stderr
    child = int(parent.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child)


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, exited and not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
