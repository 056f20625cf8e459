"""`nlp.pipe` with the biLM one batch ahead in a background thread: the `elmo` component's
`overlap` setting.

While the components after `elmo` work on batch i, the biLM runs on batch i + 1; its LSTM steps
run as one TorchScript call that releases the GIL (`bilm.lstm.compiled_loop`), so both run at
once on two cores or more, the biLM on one torch thread fewer (`util.threads.bilm_threads`).
The layers are those of the component in turn on that many threads, bit for bit
(tests/pipeline/test_overlap.py). Measured: docs/research/pipeline-speed.md.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from functools import partial
from typing import Callable, Iterable, Iterator, List, Optional

from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc
from spacy.util import minibatch
from thinc.api import NumpyOps

from ..layers.elmo_model import ensure_weights, get_bilm
from ..util.threads import bilm_threads


def overlap_applies(component: TrainablePipe) -> bool:
    """Whether `component.pipe` runs the biLM ahead of the components after it: its `overlap`
    setting, on the CPU, two threads or more, the steps in the compiled loop; loads the
    default weights first if that has not happened yet."""
    if not component.cfg["overlap"] or not isinstance(component.model.ops, NumpyOps):
        return False
    if bilm_threads(component.cfg["threads"], overlapped=True) < 1:
        return False
    ensure_weights(component.model)
    return get_bilm(component.model).steps_release_gil()


def overlapped_pipe(
    component: TrainablePipe, stream: Iterable[Doc], batch_size: int
) -> Iterator[Doc]:
    """The docs of `stream` with the component's annotations, in order, in batches of
    `batch_size`: batch i + 1 predicted in a thread of its own, started once batch i's is
    done, while batch i is with the caller. Errors go to the component's error handler, batch
    by batch, as in `TrainablePipe.pipe`. Each batch's thread ends with its batch, so a call
    that a later component stops (or a caller that leaves early) leaves no thread behind once
    the batch ahead is done, and each call holds its own batches' results: none can reach
    another call."""
    error_handler = component.get_error_handler()
    threads = bilm_threads(component.cfg["threads"], overlapped=True)
    pending: Optional[BatchAhead] = None
    ahead: Optional[BatchAhead] = None
    try:
        for docs in minibatch(stream, size=batch_size):
            if pending is not None:
                pending.join()  # one prediction at a time: two would hold two batches' layers
            ahead = BatchAhead(f"{component.name}-bilm", component.predict, docs, threads)
            if pending is not None:
                yield from _finish(component, pending, error_handler)
            pending = ahead
        if pending is not None:
            yield from _finish(component, pending, error_handler)
    finally:  # stopped early: the batch ahead ends before this returns
        for batch in (pending, ahead):
            if batch is not None:
                batch.join()


class BatchAhead(threading.Thread):
    """One batch's `predict(docs, threads=threads)`, run in a new thread named `name`."""

    def __init__(self, name: str, predict: Callable, docs: List[Doc], threads: int) -> None:
        super().__init__(name=name, daemon=True)
        self.docs = docs
        self.layers: Future = Future()  # raises the prediction's error to the caller
        self._predict = partial(predict, docs, threads=threads)
        self.start()

    def run(self) -> None:
        try:
            self.layers.set_result(self._predict())
        except BaseException as error:
            self.layers.set_exception(error)


def _finish(component: TrainablePipe, batch: BatchAhead, error_handler) -> Iterator[Doc]:
    """One batch's docs, annotated here, in the calling thread."""
    try:
        component.set_annotations(batch.docs, batch.layers.result())
        yield from batch.docs
    except Exception as error:
        error_handler(component.name, component, batch.docs, error)
