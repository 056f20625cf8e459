"""Shared by the benchmark scripts: what machine and code a result was measured on."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def machine_info() -> dict:
    """The CPU, its cores and memory, Python and torch versions, date, platform and commit."""
    import datetime
    import os
    import platform

    import torch

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
    }
    try:
        info["memory_gib"] = round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        )
    except (ValueError, OSError):
        pass
    commit = git_commit()
    if commit:
        info["git_commit"] = commit
    return info


def git_commit() -> str | None:
    """The repository's short commit, with "+dirty" when tracked files have changes."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def tensor_peak(function) -> tuple[int, int, object]:
    """(peak, final, result): bytes held by torch's CPU allocator while `function()` runs.

    Counted from zero at the start, so tensors that already exist (the weights) are not in it;
    everything allocated during the call is, including oneDNN's buffers (PyTorch routes them
    through the same allocator). The CPU analogue of `torch.cuda.max_memory_allocated`, read
    from the profiler's memory events; the profiler slows the call down, so time it apart.
    """
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        result = function()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    totals = [
        event["args"]["Total Allocated"]
        for event in events
        if event.get("name") == "[memory]" and event["args"].get("Device Type") == 0
    ]
    return max(totals, default=0), (totals[-1] if totals else 0), result
