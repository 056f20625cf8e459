"""torch's CPU threads: the one function that decides the count (`thread_count`), and a
warning when a count outnumbers the CPUs this process may run at once.

Under a CPU quota (`docker --cpus 2`, a Kubernetes limit) torch still starts a thread per core,
and the biLM, whose threads wait for each other hundreds of times per sentence, runs many times
slower (docs/performance.md#threads-on-a-shared-machine). The commands' --threads, `pretrain`,
each corpus worker (`use_threads`) and the `elmo` component (`bilm_threads`) all count here.
"""

from __future__ import annotations

import math
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CGROUP_ROOT = Path("/sys/fs/cgroup")
ADVICE = "docs/performance.md#threads-on-a-shared-machine"
_warned = False
_IMPORTED_IN = os.getpid()  # a process forked after this import has another id


class ThreadsWarning(RuntimeWarning):
    """torch's CPU threads outnumber the CPUs this process may use."""


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time per period that this process's cgroup allows (cgroup v2 `cpu.max`,
    or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None without a limit or where unreadable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "max 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota = int((root / controller / "cpu.cfs_quota_us").read_text())
            period = int((root / controller / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota <= 0 or period <= 0 else quota / period
    return None


def usable_cpus(root: Path = CGROUP_ROOT) -> tuple[int, str]:
    """(CPUs this process can run on at once, what limits them): the cores it may be scheduled
    on (its affinity), and fewer under a cgroup CPU quota (rounded down, at least 1)."""
    try:
        cpus, source = len(os.sched_getaffinity(0)), "the cores this process may run on"
    except (AttributeError, OSError):  # not on Linux
        cpus, source = os.cpu_count() or 1, "the machine's cores"
    quota = cgroup_cpu_quota(root)
    if quota is not None and max(1, math.floor(quota)) < cpus:
        cpus, source = max(1, math.floor(quota)), f"the cgroup's CPU quota of {quota:g} CPUs"
    return cpus, source


def thread_count(threads: int | None, what: str = "--threads") -> int:
    """The torch CPU threads for a setting (`what` names it; not a positive integer: ValueError).

    A count given is kept, with one ThreadsWarning a process when it outnumbers the usable CPUs;
    by default (None) torch's count (OMP_NUM_THREADS, as `torchrun` sets it) lowered to
    `usable_cpus`. 1 in a process forked after this import (`nlp.pipe(n_process=N)`'s workers):
    the parent's OpenMP pool does not survive `fork`, and a child's product would wait forever.
    """
    global _warned
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"{what} must be a positive integer, got {threads!r}")
    if os.getpid() != _IMPORTED_IN:
        return 1
    if threads is None:
        import torch

        return min(torch.get_num_threads(), usable_cpus(CGROUP_ROOT)[0])
    if threads > 1 and not _warned:  # one thread always fits: no need to look at the CPUs
        cpus, source = usable_cpus(CGROUP_ROOT)
        if threads > cpus:
            _warned = True
            message = (
                f"torch runs {threads} CPU threads, but this process can run only {cpus} at "
                f"once ({source}); ELMo then runs many times slower than with {cpus}. Call "
                f"torch.set_num_threads({cpus}) (or give {what} {cpus}); see {ADVICE}"
            )
            warnings.warn(message, ThreadsWarning, stacklevel=3)
    return threads


def use_threads(threads: int | None, what: str = "--threads") -> int:
    """Set torch's intra-op CPU threads for this process to `thread_count(threads, what)`
    (the commands' --threads, `pretrain`, each corpus worker); the count set."""
    import torch

    count = thread_count(threads, what)
    torch.set_num_threads(count)
    return count


def bilm_threads(threads: int | None, *, overlapped: bool = False, training: bool = False) -> int:
    """The `elmo` component's biLM threads: `thread_count` of its `threads` setting, by default
    1 in training (torch's threads beside other work wait on each other: `spacy train` 10x
    slower, docs/performance.md); one fewer when overlapped (a core left to the components
    after it; 0 where none is spare)."""
    if threads is None and training:
        threads = 1
    return thread_count(threads, "the elmo component's threads") - int(overlapped)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block on `count` torch threads (`bilm_threads`), and put back the count it
    had after (not in a forked child, where more than one thread would hang)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)  # a fraction of a microsecond, even when it is the count already
    try:
        yield
    finally:
        if os.getpid() == _IMPORTED_IN:
            torch.set_num_threads(before)
