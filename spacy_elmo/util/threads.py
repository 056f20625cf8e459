"""torch's CPU threads: the one place that sets them (`use_threads`), and a warning when they
outnumber the CPUs this process may run at once.

torch starts one thread per core this process may run on. A container limited by a CPU quota
(`docker --cpus 2`, a Kubernetes CPU limit) on a larger machine cannot run them all at once:
torch's default does not see the quota. The biLM, whose threads wait for each other hundreds of
times per sentence, then runs many times slower, as it does beside other busy jobs (25-130x
beside one on a 2-core machine: docs/performance.md#threads-on-a-shared-machine). The same
holds for threads set by hand beyond the cores of the process's affinity (`taskset`).

`use_threads` is what every part of spacy-elmo that chooses a count calls: the commands'
--threads, `pretrain` (its `threads` setting), each corpus worker (--threads-per-worker) and the
child of a fork. By default it lowers torch's count to the usable CPUs; a count given beyond
them is kept and warned about, once per process, with one message. The `elmo` component (on the
CPU) only checks (`warn_if_oversubscribed`): the threads of a process that loads a pipeline are
that process's to choose.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
ADVICE = "docs/performance.md#threads-on-a-shared-machine"
_warned = False


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


def oversubscription(threads: int, cpus: int, source: str, what: str = "--threads") -> str | None:
    """The warning for `threads` torch threads on `cpus` usable CPUs, or None if they fit;
    `what` is the option that sets the count."""
    if threads <= cpus:
        return None
    return (
        f"torch runs {threads} CPU threads, but this process can run only {cpus} at once "
        f"({source}); ELMo then runs many times slower than with {cpus}. Call "
        f"torch.set_num_threads({cpus}) (or give {what} {cpus}); see {ADVICE}"
    )


def use_threads(threads: int | None, what: str = "--threads") -> int:
    """Set torch's intra-op CPU threads for this process; the count set.

    `threads`, or by default (None) torch's current count (which follows OMP_NUM_THREADS, as
    `torchrun` sets it) lowered to the CPUs this process may run at once (`usable_cpus`: its
    affinity, a cgroup CPU quota). A count given beyond those CPUs is kept and warned about
    once per process (ThreadsWarning). `what` names the setting in messages ("--threads",
    "--threads-per-worker"); a count that is not a positive integer is a ValueError naming it.
    """
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ValueError(f"{what} must be a positive integer, got {threads!r}")
    import torch

    if threads is None:
        threads = min(torch.get_num_threads(), usable_cpus(CGROUP_ROOT)[0])
    elif threads > 1:  # one thread always fits: no need to look at the CPUs
        _warn_once(oversubscription(threads, *usable_cpus(CGROUP_ROOT), what))
    torch.set_num_threads(threads)
    return threads


def restore_threads(threads: int) -> None:
    """Put back torch's thread count to `threads`, a count this process had before (so not
    checked again: the overlapped `elmo` component puts back the caller's own setting)."""
    import torch

    torch.set_num_threads(threads)


def warn_if_oversubscribed(root: Path | None = None) -> str | None:
    """Warn (once per process) when torch's threads outnumber the usable CPUs; the message.
    Changes no setting (the `elmo` component's check)."""
    if _warned:
        return None
    import torch

    return _warn_once(oversubscription(torch.get_num_threads(), *usable_cpus(root or CGROUP_ROOT)))


def _warn_once(message: str | None) -> str | None:
    """Warn with `message` (ThreadsWarning) unless None or this process already warned."""
    global _warned
    if message is None or _warned:
        return None
    _warned = True
    warnings.warn(message, ThreadsWarning, stacklevel=4)
    return message
