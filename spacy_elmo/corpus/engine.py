"""Running shards on Ray actors, the model loaded once in each (docs/corpus.md says why Ray).

A local instance ends with the run, with every process it started (reaper.py); a running
cluster (`address`) is left running. `ray.init(address=...)` waits without end when nothing
answers there, so a TCP connection and a gRPC handshake check the address first, in bounded time.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol

from ..util.extras import install_hint
from ..util.signals import deferred

# A killed worker is restarted (each time: an overnight run may lose many), and the shard it was
# running is retried this many times (a shard that kills every worker it meets then fails).
MAX_RETRIES = 3
# Shards queued on each worker beyond the one it runs, so it never waits for the driver.
QUEUE_PER_WORKER = 1
# How long the driver waits for a shard before it looks at signals again.
WAIT_SECONDS = 1.0
# The local instance's shared-memory object store: only shard names and results pass through.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024**2
# A line of Ray's own C++ log on standard error ("[2026-12-07 04:07:19,320 W 12927 12928] ..."),
# written as it starts and ends: dropped.
RAY_LOG_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] ")
# How long the address check waits for a cluster to answer (seconds), unless this says.
TIMEOUT_VARIABLE = "SPACY_ELMO_RAY_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT = 10.0
RAY_CLIENT_PORT = 10001  # Ray's default for `ray://host`


class Job(Protocol):
    """What a worker does: `setup()` once (load the model), then `run(state, payload)` per shard."""

    unit: str  # what one input line is (the progress bar's unit)

    def setup(self) -> Any: ...

    def run(self, state: Any, payload: Any) -> dict[str, Any]: ...

    def options(self) -> dict[str, Any]:
        """What changes the outputs (the manifest records it; a change redoes them)."""


@dataclass(frozen=True)
class Cluster:
    """Where the workers run. `workers`: how many (default: the CPUs / threads per worker);
    `address`: a running cluster (default: RAY_ADDRESS, else a local instance)."""

    workers: Optional[int] = None
    address: Optional[str] = None
    threads_per_worker: Optional[int] = None
    gpus_per_worker: float = 0.0

    def __post_init__(self) -> None:
        counts = {"workers": self.workers, "threads_per_worker": self.threads_per_worker}
        check_positive(**{name: value for name, value in counts.items() if value is not None})
        if not isinstance(self.gpus_per_worker, (int, float)) or self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker must be >= 0, got {self.gpus_per_worker!r}")


def check_positive(**values: Any) -> None:
    """ValueError naming the first of `values` that is not a positive integer."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class Task:
    """A unit of work: what the worker is given, and how the driver names and counts it."""

    name: str  # for messages: "corpus/a.txt lines 1-1000"
    lines: int  # counted by the progress bar when done (0 for a join)
    payload: Any


@dataclass
class RunStats:
    """What a run measured: Ray's start-up, the shards, the workers."""

    startup_seconds: float = 0.0  # Ray start (or connect) + every worker's model loaded
    run_seconds: float = 0.0  # first shard submitted -> last result
    lines: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (task name, error)
    workers: set[str] = field(default_factory=set)  # "host:pid"
    nodes: set[str] = field(default_factory=set)


def require_ray():
    """The `ray` module, or ImportError saying how to install it."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")  # read at Ray's import
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"corpus commands run on Ray, which is not installed: {install_hint('ray', 'ray')}"
        ) from None
    return ray


class CorpusWorker:
    """A Ray actor (see `run_tasks`): holds the job's state (the model) between shards."""

    def __init__(self, job: Job, threads: int, gpus: float) -> None:
        from ..util.threads import use_threads

        use_threads(threads, "--threads-per-worker")
        self.job, self.state = job, None

    def setup(self) -> dict[str, Any]:
        if self.state is None:
            self.state = self.job.setup()
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"worker": f"{socket.gethostname()}:{os.getpid()}", "node": node}

    def run(self, payload: Any) -> dict[str, Any]:
        identity = self.setup()  # after a restart (the worker was killed), loaded again
        return {**self.job.run(self.state, payload), **identity}


def run_tasks(
    job: Job,
    tasks: list[Task],
    cluster: Cluster,
    on_done: Callable[[Task, dict[str, Any]], list[Task]],
    progress: bool = True,
    description: str = "shards",
) -> RunStats:
    """Run `tasks` on Ray workers; `on_done(task, result)` returns follow-up tasks (joins).

    A task that raises, or whose worker died MAX_RETRIES + 1 times, goes to `stats.failures`
    and the others go on. A local Ray instance started here ends before this returns.
    """
    from tqdm import tqdm

    ray = require_ray()
    from .reaper import start_reaper, stop_reaper  # psutil: the [ray] extra

    stats = RunStats()
    start = time.perf_counter()
    address = cluster.address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        from ..util.threads import usable_cpus

        cpus = usable_cpus()[0]  # this machine's cores, fewer under a container's CPU quota
        wanted = (cluster.workers or 1) * (cluster.threads_per_worker or 1)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        init = {
            "address": "local",
            "num_cpus": max(cpus, wanted),
            "include_dashboard": False,
            "object_store_memory": LOCAL_OBJECT_STORE_BYTES,
            "_node_ip_address": "127.0.0.1",
        }
    else:
        check_ray_address(address)  # ray.init waits without end when nothing answers there
        init = {"address": address}
    reaper = None
    ray_ended = threading.Event()
    try:
        with _ray_lines_dropped(), deferred():  # a signal is acted on once Ray has started
            reaper = start_reaper()
            _start_ray(ray, ray_ended, **init)
        workers, threads = _placement(ray, cluster, address)
        actor_class = ray.remote(
            num_cpus=threads,
            num_gpus=cluster.gpus_per_worker,
            max_restarts=-1,
            max_task_retries=MAX_RETRIES,
        )(CorpusWorker)
        actors = [actor_class.remote(job, threads, cluster.gpus_per_worker) for _ in range(workers)]
        for info in _gather(ray, [a.setup.remote() for a in actors]):
            stats.workers.add(info["worker"])
            stats.nodes.add(info["node"])
        stats.startup_seconds = time.perf_counter() - start
        bar = tqdm(
            total=sum(task.lines for task in tasks),
            unit=" " + job.unit,
            desc=description,
            disable=not progress,
            smoothing=0.05,
            dynamic_ncols=True,
        )
        with bar:
            _drive(ray, actors, tasks, on_done, stats, bar)
        stats.run_seconds = time.perf_counter() - start - stats.startup_seconds
    finally:
        # Disconnect from Ray (ending a local instance), then the watchdog ends what is left of
        # the processes the run started; a signal meanwhile waits until they are gone.
        with deferred(), _ray_lines_dropped():
            try:
                ray.shutdown()
            finally:
                stop_reaper(reaper)
        ray_ended.set()
    return stats


def _drive(ray, actors, tasks, on_done, stats, bar) -> None:
    queue = deque(tasks)
    running: dict[Any, tuple[Any, Task]] = {}  # ref -> (actor, task)
    while queue or running:
        while queue and len(running) < len(actors) * (1 + QUEUE_PER_WORKER):
            actor = min(actors, key=lambda a: sum(1 for b, _ in running.values() if b is a))
            task = queue.popleft()
            running[actor.run.remote(task.payload)] = (actor, task)
        # With a timeout, so that Ctrl-C and SIGTERM are acted on within a second.
        ready, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_SECONDS)
        if not ready:
            continue
        (ref,) = ready
        task = running.pop(ref)[1]
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            # Ray restarted the worker and ran the shard again MAX_RETRIES times, and each
            # time the worker died: a shard that kills workers (out of memory, say).
            died = f"its worker died each of {MAX_RETRIES + 1} times it ran it (killed, or out"
            _fail(stats, bar, task, f"{died} of memory?): {_first_line(error)}")
        except ray.exceptions.RayTaskError as error:
            _fail(stats, bar, task, _cause(error))
        else:
            stats.lines += task.lines
            stats.workers.add(result["worker"])
            stats.nodes.add(result["node"])
            bar.update(task.lines)
            queue.extendleft(on_done(task, result))


def _fail(stats: RunStats, bar, task: Task, message: str) -> None:
    stats.failures.append((task.name, message))
    bar.write(f"error: {task.name}: {message}", file=sys.stderr)


def _gather(ray, refs: list) -> list[dict[str, Any]]:
    """The workers' set-up results; the model's load error as a ValueError, not a Ray one."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as error:
        cause = getattr(error, "cause", None)
        if isinstance(cause, (ValueError, OSError, ImportError)):
            raise cause from None
        raise ValueError(f"a worker could not load the model: {_cause(error)}") from None


def _placement(ray, cluster: Cluster, address: Optional[str]) -> tuple[int, int]:
    """How many workers, of how many threads each (by default, from the nodes' CPUs: a worker's
    threads are on one node); ValueError for workers that could never all start (Ray would wait
    for them for ever)."""
    node_cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    workers, gpus = cluster.workers, cluster.gpus_per_worker
    total = int(sum(node_cpus)) or 1
    threads = cluster.threads_per_worker or max(
        1, min(int(max(node_cpus, default=1)), total // (workers or total))
    )
    slots = sum(int(cpus // threads) for cpus in node_cpus)  # workers of `threads` that fit
    workers = workers or max(1, slots)
    where = f"the Ray cluster at {address}" if address else "this machine's Ray instance"
    gpus_there = ray.cluster_resources().get("GPU", 0)
    if gpus and gpus_there < workers * gpus:
        raise ValueError(
            f"{workers} workers x {gpus:g} GPUs need {workers * gpus:g} GPUs; {where} has "
            f"{gpus_there:g}"
        )
    if slots < workers:
        raise ValueError(
            f"{workers} workers x {threads} threads do not fit on {where}: its nodes have "
            f"{', '.join(f'{c:g}' for c in node_cpus)} CPUs, room for {slots} such workers "
            "(lower --workers or --threads-per-worker)"
        )
    return workers, threads


def _start_ray(ray, ended: threading.Event, **init: Any) -> None:
    """`ray.init` off the main thread, so that Ray sets no signal handler; the thread lives until
    Ray has ended (`ended`): the processes Ray starts from it die with it (PR_SET_PDEATHSIG)."""
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    started: Future = Future()

    def start() -> None:
        try:
            ray.init(**init, log_to_driver=False, logging_level=logging.ERROR)
        except BaseException as error:  # noqa: BLE001 - raised on the main thread
            started.set_exception(error)
            return
        started.set_result(None)
        ended.wait()

    threading.Thread(target=start, name="ray-start", daemon=True).start()
    try:
        started.result()
    except ConnectionError as error:
        if init["address"] == "local":
            raise
        raise ValueError(
            f"cannot join the Ray cluster at {init['address']}: {_first_line(error)}"
        ) from None


def connect_timeout() -> float:
    """Seconds the check waits for an answer: SPACY_ELMO_RAY_CONNECT_TIMEOUT, else 10."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is not a positive number of seconds")
    return value


def check_ray_address(address: str) -> None:
    """ValueError naming `address` unless a gRPC server (a Ray cluster's GCS or a Ray client
    server) answers there within `connect_timeout()` seconds. Addresses Ray resolves itself
    ("auto") are resolved first; a form this cannot read is left to Ray."""
    timeout = connect_timeout()
    endpoint = _endpoint(_resolve(address))
    if endpoint is None:
        return
    host, port = endpoint
    deadline = time.monotonic() + timeout
    hint = f"is a Ray cluster running there (`ray start --head`)? ({TIMEOUT_VARIABLE}={timeout:g}s)"
    try:  # a refused connection is said at once, where gRPC would try again until the timeout
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, socket.timeout) else error.strerror or error
        raise ValueError(f"cannot join the Ray cluster at {address}: {reason}; {hint}") from None
    if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true"):
        return  # a TLS cluster: a plain gRPC channel cannot tell
    import grpc

    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with grpc.insecure_channel(target) as channel:
        try:
            ready = grpc.channel_ready_future(channel)
            ready.result(timeout=max(0.001, deadline - time.monotonic()))
        except grpc.FutureTimeoutError:
            raise ValueError(
                f"cannot join the Ray cluster at {address}: {host}:{port} accepts connections "
                f"but nothing answered a gRPC handshake within {timeout:g}s; {hint}"
            ) from None


def _resolve(address: str) -> str:
    if address.strip() != "auto":
        return address.strip()
    try:  # Ray's own lookup of the latest `ray start` cluster
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address("auto") or address
    except Exception:  # noqa: BLE001 - none found, or another Ray: Ray's own error follows
        return address


def _endpoint(address: str) -> Optional[tuple[str, int]]:
    """(host, port) of `host:port`, `ray://host:port` or `[v6]:port`; None for other forms."""
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://")
    if "://" in rest or "/" in rest:
        return None
    if client and not rest.endswith("]") and ":" not in rest:
        rest += f":{RAY_CLIENT_PORT}"
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not host or not 0 < int(port) < 65536:
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


@contextmanager
def _ray_lines_dropped() -> Iterator[None]:
    """Standard error (fd 2, where Ray's C++ code writes) held back, and passed on at the end
    without Ray's own log lines (RAY_LOG_LINE)."""
    sys.stderr.flush()
    kept = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(kept, 2)
            os.close(kept)
            held.seek(0)
            written = held.read().splitlines(keepends=True)
            passed = b"".join(line for line in written if not RAY_LOG_LINE.match(line))
            if passed:
                os.write(2, passed)


def _cause(error: Exception) -> str:
    cause = getattr(error, "cause", None)
    if cause is None:
        return _first_line(error)
    return str(cause) if isinstance(cause, ValueError) else f"{type(cause).__name__}: {cause}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
