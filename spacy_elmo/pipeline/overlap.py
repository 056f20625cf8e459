"""`nlp.pipe` with the biLM one batch ahead: the `elmo` component's `overlap` setting.

`nlp.pipe` runs the components in turn on each batch: the biLM on torch's threads, then the
tagger, parser or NER after it on one. With `overlap`, the `elmo` component's `pipe` runs the
biLM on the next batch in a background thread while the components after it work on this batch,
so that both run at once on a machine with two cores or more. The biLM's LSTM steps run as one
TorchScript call that releases the GIL (`bilm.fast_paths.run_steps`); a step loop in Python
would take it back a dozen times a step.

Where it applies: the biLM on the CPU with its LSTM steps in the compiled loop
(`fast_paths.steps_release_gil`: unless SPACY_ELMO_PYTHON_STEPS or SPACY_ELMO_REFERENCE),
torch set to two threads or more. The background thread runs the biLM on one thread fewer than
torch's setting, leaving a core to the calling thread (the biLM on all of them beside it ran slower
than in turn: its threads wait on each other); torch's setting is put back when the batches are
done. `nlp(doc)`, a GPU, and one torch thread (each process of `nlp.pipe(n_process=N)`) run the
component in turn, as `TrainablePipe.pipe`.

Each batch runs through the same computation, on another thread: the layers are those of the
component in turn on one torch thread fewer, bit for bit, and within float rounding (about 1e-6)
of those on as many threads, where the GEMMs add up their products in another order
(tests/pipeline/test_overlap.py).

With `overlap = "process"` the biLM runs one batch ahead in a child process instead
(`bilm_process.py`), two batches ahead, out of reach of the calling process's GIL: it applies
on the CPU with two torch threads or more, whichever way the steps run, and gives the same
layers (the child runs on one torch thread fewer too).

Measured: benchmarks/bench_overlap.py, docs/performance.md.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, List, Optional

import torch
from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc
from spacy.util import minibatch
from thinc.api import NumpyOps

from ..bilm import fast_paths
from ..layers.elmo_model import get_bilm, model_units
from ..util.threads import restore_threads, use_threads
from . import bilm_process

PROCESS_AHEAD = 2  # batches sent to the biLM's process before the first one is taken back


def check_overlap(value: Any, where: str = "overlap") -> Optional[str]:
    """The way named by an `overlap` setting: "thread" (true or "thread"), "process", or None
    (false: in turn); ValueError for anything else."""
    if value is True or value == "thread":
        return "thread"
    if value == "process":
        return value
    if value is False:
        return None
    raise ValueError(f'{where} must be true, false, "thread" or "process", got {value!r}')


def overlap_way(component: TrainablePipe) -> Optional[str]:
    """How `component.pipe` runs the biLM ahead: "thread", "process", or None (in turn), by
    its `overlap` setting and where it runs (see the module's docstring); loads the default
    weights first if that has not happened yet."""
    way = check_overlap(component.cfg.get("overlap", False), f"overlap of '{component.name}'")
    if not (way and isinstance(component.model.ops, NumpyOps) and torch.get_num_threads() >= 2):
        return None
    component.ensure_weights()
    if way == "process" and bilm_process.SUPPORTED:
        return way
    return "thread" if fast_paths.steps_release_gil(get_bilm(component.model)) else None


def overlap_applies(component: TrainablePipe) -> bool:
    """Whether `component.pipe` runs the biLM ahead of the components after it."""
    return overlap_way(component) is not None


def overlapped_pipe(
    component: TrainablePipe, stream: Iterable[Doc], batch_size: int
) -> Iterator[Doc]:
    """The docs of `stream` with the component's annotations, in order, in batches of
    `batch_size`: batch i + 1 predicted in a background thread while batch i is with the
    caller. Errors go to the component's error handler, batch by batch, as in
    `TrainablePipe.pipe`."""
    threads = torch.get_num_threads()
    error_handler = component.get_error_handler()
    pool = ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=f"{component.name}-bilm",
        initializer=use_threads,
        initargs=(threads - 1, "the overlapped biLM's threads"),
    )
    try:
        pending = None
        for docs in minibatch(stream, size=batch_size):
            future = pool.submit(component.predict, docs)
            if pending is not None:
                yield from _finish(component, *pending, error_handler)
            pending = (docs, future)
        if pending is not None:
            yield from _finish(component, *pending, error_handler)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        restore_threads(threads)


def _finish(
    component: TrainablePipe, docs: List[Doc], future: Future, error_handler
) -> Iterator[Doc]:
    """One batch's docs, annotated here, in the calling thread."""
    try:
        component.set_annotations(docs, future.result())
        yield from docs
    except Exception as error:
        error_handler(component.name, component, docs, error)


def process_pipe(component: TrainablePipe, stream: Iterable[Doc], batch_size: int) -> Iterator[Doc]:
    """As `overlapped_pipe`, the biLM in the component's child process (`bilm_process.py`),
    PROCESS_AHEAD batches ahead: this process cuts each batch into units and sends them, and
    annotates the docs when their layers come back."""
    worker = component.bilm_process()
    error_handler = component.get_error_handler()
    model = component.model
    pending: deque = deque()  # (docs, the error of cutting them into units, or None)

    def finish() -> Iterator[Doc]:
        docs, error = pending.popleft()
        try:
            if error is not None:
                raise error
            component.set_annotations(docs, worker.result())
            yield from docs
        except bilm_process.BiLMProcessError:
            raise
        except Exception as error:
            error_handler(component.name, component, docs, error)

    try:
        for docs in minibatch(stream, size=batch_size):
            try:
                worker.submit(model_units(model, docs), [len(doc) for doc in docs])
                pending.append((docs, None))
            except bilm_process.BiLMProcessError:
                raise
            except Exception as error:  # no units: nothing was sent for these docs
                pending.append((docs, error))
            if len(pending) > PROCESS_AHEAD:
                yield from finish()
        while pending:
            yield from finish()
    finally:
        worker.discard()  # replies of batches nobody will take (stopped early)
