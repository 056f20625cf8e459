"""The `elmo` component's biLM in a process of its own: `overlap = "process"`.

With `overlap = true` the biLM runs one batch ahead in a background thread of the calling
process. Its LSTM steps release the GIL, but the rest of its work (the units, the character
ids, the batches, copying the layers out) does not, and the tagger, parser or NER beside it
hold it too: the two threads slow each other down (docs/performance.md). Here the biLM runs in
a child process, which has its own interpreter:

* the calling process cuts each batch's docs into the biLM's units (`elmo_model.model_units`)
  and sends them down a pipe; the child runs `elmo_model.predict_units` on them, exactly the
  model's prediction, and sends the layers back from a second thread, so that it starts on the
  next batch while the layers are on their way: the batch's layers as one array, its bytes
  written straight into the pipe and read straight into an array here (a pickled list of
  arrays costs two more copies on each side), each doc's layers copied out of it;
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

POSIX only (the pipes are passed to the child as file descriptors); elsewhere the setting runs
as `overlap = true`. Measured: benchmarks/bench_overlap.py, docs/performance.md.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Deque, List, Optional, Tuple

import numpy
import torch
from thinc.api import Model

from ..bilm.quantize import set_quantize
from ..layers.elmo_model import get_bilm, predict_units
from ..layers.layer_cache import layer_cache
from ..layers.sentence_units import Unit

SUPPORTED = os.name == "posix"
STOP_TIMEOUT_S = 10.0  # how long `close` waits for the child to exit before killing it
CHILD = f"from {__name__} import main; main()"  # the child's program (python -c)
PIPE_BYTES = 2**20  # the pipes' buffer, where Linux allows it (F_SETPIPE_SZ; default 64 KiB)


class BiLMProcessError(RuntimeError):
    """The biLM's process could not start or went away."""


def model_key(model: Model, quantize: Optional[str], threads: int) -> Tuple[Any, ...]:
    """What the child's copy of the model must match: the biLM object, the version of each of
    its tensors (an optimiser step or `load_state_dict` bumps it), the settings that shape the
    prediction, and the child's torch threads."""
    bilm = get_bilm(model)
    tensors = list(bilm.parameters()) + list(bilm.buffers())
    return (
        id(bilm),
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


class BiLMProcess:
    """A child process holding a copy of an `elmo_model`: `submit` sends a batch's units,
    `result` returns the layers of the oldest batch sent and not yet taken, in order."""

    def __init__(self, model: Model, quantize: Optional[str], threads: int) -> None:
        if not SUPPORTED:
            raise BiLMProcessError(f"the biLM's own process needs POSIX pipes, not {os.name}")
        self.key = model_key(model, quantize, threads)
        self.owner = os.getpid()
        self._lengths: Deque[Optional[List[int]]] = deque()  # of each batch in flight
        self._clean = True  # False while a message is half sent or half read
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # The child finds the modules this process found (the model may name a user's code).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        _widen(from_child_r)
        self._to_child = Connection(to_child_w, readable=False)
        self._from_child = Connection(from_child_r, writable=False)
        self._finalizer = weakref.finalize(self, _stop, self.process, self._to_child, self.owner)
        try:
            self._send(("load", pickled_model(model), quantize, threads))
            self._lengths.append(None)
            self.result()  # "ready", or the child's error
        except Exception as error:
            self.close()
            raise BiLMProcessError(f"the biLM process could not load the model: {error}") from error

    def submit(self, units: List[Unit], lengths: List[int]) -> None:
        """Send one batch: its units and the length of each doc."""
        self._send(("predict", units, lengths))
        self._lengths.append(lengths)

    @property
    def in_flight(self) -> int:
        """Batches sent whose replies have not been taken."""
        return len(self._lengths)

    def result(self) -> Any:
        """The layers of the oldest batch in flight, one array per doc; the child's error,
        raised here."""
        if not self._lengths:
            raise BiLMProcessError("no batch in flight")
        self._clean = False
        try:
            status, value = self._from_child.recv()
            if status == "layers":  # (dtype, shape) of the batch's layers, their bytes next
                layers = numpy.empty(value[1], dtype=value[0])
                _read_into(self._from_child.fileno(), memoryview(layers).cast("B"))
        except (EOFError, OSError) as error:
            raise BiLMProcessError(self._gone_message()) from error
        self._clean = True
        lengths = self._lengths.popleft()
        if status == "error":
            raise value
        if status != "layers":
            return value
        ends = numpy.cumsum(lengths).tolist()
        return [layers[:, end - n : end].copy() for n, end in zip(lengths, ends)]

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


def _stop(process: subprocess.Popen, to_child: Connection, owner: int) -> None:
    """Ask the child to exit (the end of its pipe), wait, kill it if it does not."""
    if os.getpid() != owner:  # a forked copy of the parent: the child is not ours to stop
        return
    to_child.close()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def serve(from_parent: Connection, to_parent: Connection) -> None:
    """The child: load the model, then predict each batch sent until the pipe ends. Replies go
    out from a second thread, in order, while the next batch is predicted."""
    sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bilm-reply")
    model: Optional[Model] = None
    last_reply = None

    def reply(message: tuple) -> None:
        nonlocal last_reply
        if last_reply is not None and last_reply.done():
            last_reply.result()  # a failed send (the parent gone) ends the loop here
        # queued behind the replies not sent yet: as many as the batches the parent sent ahead
        last_reply = sender.submit(_send_reply, to_parent, message)

    while True:
        try:
            message = from_parent.recv()
        except EOFError:  # the parent closed the pipe or went away
            break
        try:
            if message[0] == "load":
                _, data, quantize, threads = message
                from ..util.threads import use_threads

                use_threads(threads, "the biLM process's threads")
                model = pickle.loads(data)
                set_quantize(get_bilm(model), quantize)
                reply(("ok", "ready"))
            else:
                _, units, lengths = message
                reply(("layers", predict_units(model, units, lengths)))
        except Exception as error:  # to the parent, which hands it to the error handler
            reply(("error", error))
    sender.shutdown(wait=True)


def _send_reply(to_parent: Connection, message: tuple) -> None:
    status, value = message
    if status == "layers":  # one array for the batch, its bytes after its dtype and shape
        layers = numpy.ascontiguousarray(numpy.concatenate(value, axis=1))
        to_parent.send((status, (layers.dtype.str, layers.shape)))
        _write_all(to_parent.fileno(), memoryview(layers).cast("B"))
        return
    try:
        to_parent.send(message)
    except (pickle.PicklingError, TypeError, AttributeError) as error:  # an unpicklable error
        to_parent.send(("error", RuntimeError(f"{value!r} (its {error})")))


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data) :]


def _read_into(fd: int, buffer: memoryview) -> None:
    while len(buffer):
        n = os.readv(fd, [buffer])
        if n == 0:
            raise EOFError("the pipe ended in the middle of a batch's layers")
        buffer = buffer[n:]


def _widen(fd: int) -> None:
    """A larger pipe buffer (fewer switches between writer and reader per batch), if allowed."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass  # not Linux, or above /proc/sys/fs/pipe-max-size: the default buffer


def main() -> None:
    """The child's entry point (`CHILD`): its pipes' file descriptors are its arguments."""
    torch.set_num_threads(1)  # until the parent says how many
    from_parent = Connection(int(sys.argv[1]), writable=False)
    serve(from_parent, Connection(int(sys.argv[2]), readable=False))
