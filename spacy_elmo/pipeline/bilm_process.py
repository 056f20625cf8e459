"""The `elmo` component's biLM in a process of its own: `overlap = "process"`.

With `overlap = true` the biLM runs one batch ahead in a background thread of the calling
process. Its LSTM steps release the GIL, but the rest of its work (the units, the character
ids, the batches, copying the layers out) does not, and the tagger, parser or NER beside it
hold it too: the two threads slow each other down (docs/performance.md). Here the biLM runs in
a child process, which has its own interpreter:

* the calling process cuts each batch's docs into the biLM's units (`elmo_model.model_units`)
  and sends them down a pipe; the child runs `elmo_model.predict_units` on them, exactly the
  model's prediction, and writes each doc's layers into a shared memory buffer, one after the
  other; a short reply says where, and the calling process copies each doc's layers out. The
  buffers are a ring of `slots` (batch n goes to slot n % slots) that both sides map, each
  grown by the child when a batch needs more: the calling process sends batch n only once it
  has taken batch n - slots (`submit` refuses more batches in flight than slots), so the child
  never writes over layers not yet taken. (Sent through the pipe instead, pickled or as raw
  bytes, the layers cost the calling process 4-9 us a word, where it is the longer side.)
* the child gets a copy of the component's Thinc model (pickled, without its training cache)
  and the `quantize` setting, and runs on one torch thread fewer than the caller's setting;
  the layers are those of the component in turn on that many threads, bit for bit;
* it is started by the first `nlp.pipe` that needs it (a new Python running `main`:
  importing torch and spaCy and unpickling the model take a few seconds) and kept for the
  next ones; it is started afresh when the biLM's weights, the `quantize` setting or torch's
  thread count change, and stopped when the component is garbage-collected, at exit, or when
  the parent goes away (the child reads the end of its pipe);
* an error in the child reaches the component's error handler with its batch, as in the
  thread; a child that dies raises `BiLMProcessError` with its exit status, and the next call
  starts a new one. An iteration stopped early takes back the replies still on their way, so
  the next one starts clean.

POSIX only (pipes and buffers are passed to the child as file descriptors: memfd on Linux, an
unlinked temporary file elsewhere); elsewhere the setting runs as `overlap = true`. Measured:
benchmarks/bench_overlap.py, docs/performance.md.
"""

from __future__ import annotations

import mmap
import os
import pickle
import subprocess
import sys
import tempfile
import weakref
from multiprocessing.connection import Connection
from typing import Any, List, Optional, Sequence, Tuple

import numpy
from thinc.api import Model
from thinc.types import Floats3d

from ..bilm.quantize import set_quantize
from ..layers.elmo_model import get_bilm, predict_units
from ..layers.layer_cache import layer_cache
from ..layers.sentence_units import Unit
from ..util.threads import use_threads

SUPPORTED = os.name == "posix"
STOP_TIMEOUT_S = 10.0  # how long `close` waits for the child to exit before killing it
CHILD = f"from {__name__} import main; main()"  # the child's program (python -c)


class BiLMProcessError(RuntimeError):
    """The biLM's process could not start or went away."""


def model_key(model: Model, quantize: Optional[str], threads: int) -> Tuple[Any, ...]:
    """What the child's copy of the model must match: the biLM object, the version of each of
    its tensors (`load_state_dict` bumps it) and its `weights_generation` (a fine-tuning step
    bumps it), the settings that shape the prediction, and the child's torch threads."""
    bilm = get_bilm(model)
    tensors = list(bilm.parameters()) + list(bilm.buffers())
    return (
        id(bilm),
        getattr(bilm, "weights_generation", 0),
        tuple((t.data_ptr(), t._version) for t in tensors),
        quantize,
        model.attrs["store_dtype"],
        model.attrs["batch_tokens"],
        threads,
    )


def pickled_model(model: Model) -> bytes:
    """The model, pickled without its cache of training layers (the child only predicts)."""
    cache = model.attrs["cache"]
    model.attrs["cache"] = layer_cache(0)
    try:
        return pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        model.attrs["cache"] = cache


class SharedBuffer:
    """A memory buffer both processes map (one slot of the ring): a memfd, or an unlinked
    temporary file where there is none; the child grows it, the other side maps it anew when
    told of a larger size."""

    def __init__(self, fd: Optional[int] = None) -> None:
        if fd is None:
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create("spacy-elmo-layers")
            else:
                with tempfile.TemporaryFile() as handle:
                    fd = os.dup(handle.fileno())
        self.fd = fd
        self.size = 0
        self.map: Optional[mmap.mmap] = None

    def ensure(self, size: int, grow: bool) -> None:
        """Mapped with at least `size` bytes; `grow`: make the buffer itself that large."""
        if size <= self.size:
            return
        if grow:
            os.ftruncate(self.fd, size)
        if self.map is not None:
            self.map.close()
        self.map, self.size = mmap.mmap(self.fd, size), size

    def arrays(self, shapes: Sequence[Tuple[int, ...]], dtype: str) -> List[numpy.ndarray]:
        """Views of one array per shape, one after the other from the start of the buffer."""
        views, offset, itemsize = [], 0, numpy.dtype(dtype).itemsize
        for shape in shapes:
            count = int(numpy.prod(shape))
            view = numpy.frombuffer(self.map, dtype=dtype, count=count, offset=offset)
            views.append(view.reshape(shape))
            offset += count * itemsize
        return views

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)


class BiLMProcess:
    """A child process holding a copy of an `elmo_model`: `submit` sends a batch's units,
    `result` returns the layers of the oldest batch sent and not yet taken, in order; at most
    `slots` batches in flight."""

    def __init__(self, model: Model, quantize: Optional[str], threads: int, slots: int) -> None:
        if not SUPPORTED:
            raise BiLMProcessError(f"the biLM's own process needs POSIX pipes, not {os.name}")
        self.owner = os.getpid()
        self._in_flight = 0  # batches sent whose replies have not been taken
        self._clean = True  # False while a message is half sent or half read
        self._slots = [SharedBuffer() for _ in range(slots)]
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        fds = [to_child_r, from_child_w] + [slot.fd for slot in self._slots]
        # The child finds the modules this process found (the model may name a user's code).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CHILD, *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._to_child = Connection(to_child_w, readable=False)
        self._from_child = Connection(from_child_r, writable=False)
        self._finalizer = weakref.finalize(
            self, _stop, self.process, self._to_child, self._slots, self.owner
        )
        self.load(model, quantize, threads)

    def load(self, model: Model, quantize: Optional[str], threads: int) -> None:
        """Give the child (a copy of) `model` in place of the one it has: the weights after a
        fine-tuning step, other settings, another thread count. Only with no batch in flight."""
        if self.in_flight:
            raise BiLMProcessError(f"{self.in_flight} batches in flight: take them first")
        try:
            self._send(("load", pickled_model(model), quantize, threads))
            self._in_flight += 1
            self.result()  # "ready", or the child's error
        except Exception as error:
            self.close()
            raise BiLMProcessError(f"the biLM process could not load the model: {error}") from error
        self.key = model_key(model, quantize, threads)

    def __reduce__(self) -> tuple:
        """A copy or pickle of the component that owns this process has none (`copy.deepcopy`
        or `pickle` of a pipeline): the copy starts its own on its first `nlp.pipe`."""
        return (type(None), ())

    def submit(self, units: List[Unit], lengths: List[int]) -> None:
        """Send one batch: its units and the length of each doc."""
        if self.in_flight >= len(self._slots):
            raise BiLMProcessError(
                f"{self.in_flight} batches in flight already, as many as the process has slots "
                "for their layers: take one (`result`) first"
            )
        self._send(("predict", units, lengths))
        self._in_flight += 1

    @property
    def in_flight(self) -> int:
        """Batches sent whose replies have not been taken."""
        return self._in_flight

    def result(self) -> Any:
        """The layers of the oldest batch in flight, one array per doc; the child's error,
        raised here."""
        if not self._in_flight:
            raise BiLMProcessError("no batch in flight")
        self._clean = False
        try:
            status, value = self._from_child.recv()
        except (EOFError, OSError) as error:
            raise BiLMProcessError(self._gone_message()) from error
        self._clean = True
        self._in_flight -= 1
        if status == "error":
            raise value
        if status != "layers":
            return value
        slot, size, dtype, shapes = value
        buffer = self._slots[slot]
        buffer.ensure(size, grow=False)
        return [view.copy() for view in buffer.arrays(shapes, dtype)]

    def discard(self) -> None:
        """Take back the replies still on their way (an iteration stopped early): the next
        batch sent gets its own reply. Stops the child where that cannot be done cleanly."""
        if not self._clean:
            self.close()
            return
        try:
            while self.in_flight:
                try:
                    self.result()
                except BiLMProcessError:
                    raise
                except Exception:  # the child's error for a batch nobody waits for any more
                    pass
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return self._clean and self.process.poll() is None

    def close(self) -> None:
        """Stop the child: asked to, then killed after STOP_TIMEOUT_S."""
        self._clean = False
        self._finalizer()

    def _send(self, message: tuple) -> None:
        self._clean = False
        try:
            self._to_child.send(message)
        except (BrokenPipeError, OSError) as error:
            raise BiLMProcessError(self._gone_message()) from error
        self._clean = True

    def _gone_message(self) -> str:
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        return (
            f"the elmo component's biLM process (pid {self.process.pid}) went away "
            f"(exit status {code}); its output above may say why. The next nlp.pipe starts a "
            "new one; `overlap = true` runs the biLM in a thread instead"
        )


def _stop(
    process: subprocess.Popen, to_child: Connection, slots: List[SharedBuffer], owner: int
) -> None:
    """Ask the child to exit (the end of its pipe), wait, kill it if it does not."""
    if os.getpid() != owner:  # a forked copy of the parent: the child is not ours to stop
        return
    to_child.close()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for slot in slots:
        slot.close()


def serve(from_parent: Connection, to_parent: Connection, slots: List[SharedBuffer]) -> None:
    """The child: load the model, then predict each batch sent until the pipe ends, batch n's
    layers into slot n % len(slots)."""
    model: Optional[Model] = None
    received = 0
    while True:
        try:
            message = from_parent.recv()
        except EOFError:  # the parent closed the pipe or went away
            break
        try:
            if message[0] == "load":
                _, data, quantize, threads = message
                use_threads(threads, "the biLM process's threads")
                model = pickle.loads(data)
                set_quantize(get_bilm(model), quantize)
                reply: tuple = ("ok", "ready")
            else:
                slot = received % len(slots)
                received += 1
                _, units, lengths = message
                reply = ("layers", (slot, *_put(slots[slot], predict_units(model, units, lengths))))
        except Exception as error:  # to the parent, which hands it to the error handler
            reply = ("error", error)
        try:
            to_parent.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # unpicklable
            to_parent.send(("error", RuntimeError(f"{reply[1]!r} (its {error})")))


def _put(buffer: SharedBuffer, layers: List[Floats3d]) -> Tuple[int, str, list]:
    """Each doc's layers into `buffer`, one after the other: (bytes, dtype, shapes)."""
    size = max(sum(x.nbytes for x in layers), 1)
    buffer.ensure(size, grow=True)
    dtype = layers[0].dtype.str if layers else "<f4"
    shapes = [x.shape for x in layers]
    for view, x in zip(buffer.arrays(shapes, dtype), layers):
        view[...] = x
    return size, dtype, shapes


def main() -> None:
    """The child's entry point (`CHILD`): the file descriptors of its pipes and buffers are its
    arguments."""
    use_threads(1, "the biLM process's threads")  # until the parent says how many
    fds = [int(arg) for arg in sys.argv[1:]]
    from_parent = Connection(fds[0], writable=False)
    serve(from_parent, Connection(fds[1], readable=False), [SharedBuffer(fd) for fd in fds[2:]])
