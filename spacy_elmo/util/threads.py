"""Whether torch has more CPU threads than this process may run at once, and a warning if so.

torch starts one thread per core this process may run on. A container limited by a CPU quota
(`docker --cpus 2`, a Kubernetes CPU limit) on a larger machine cannot run them all at once:
torch's default does not see the quota. The biLM, whose threads wait for each other hundreds of
times per sentence, then runs many times slower, as it does beside other busy jobs (25-130x
beside one on a 2-core machine: docs/performance.md#threads-on-a-shared-machine). The same
holds for threads set by hand beyond the cores of the process's affinity (`taskset`). The
`elmo` component (on the CPU) and the command line (without --threads) check once per process
and warn; they change no setting (`torch.set_num_threads` is the process's to choose).
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


def oversubscription(threads: int, cpus: int, source: str) -> str | None:
    """The warning for `threads` torch threads on `cpus` usable CPUs, or None if they fit."""
    if threads <= cpus:
        return None
    return (
        f"torch runs {threads} CPU threads, but this process can run only {cpus} at once "
        f"({source}); ELMo then runs many times slower than with {cpus}. Call "
        f"torch.set_num_threads({cpus}) (or give --threads {cpus}); see {ADVICE}"
    )


def warn_if_oversubscribed(root: Path | None = None) -> str | None:
    """Warn (once per process) when torch's threads outnumber the usable CPUs; the message."""
    global _warned
    if _warned:
        return None
    import torch

    message = oversubscription(torch.get_num_threads(), *usable_cpus(root or CGROUP_ROOT))
    if message is not None:
        _warned = True
        warnings.warn(message, ThreadsWarning, stacklevel=3)
    return message
