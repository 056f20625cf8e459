"""Shared by the benchmark scripts: what machine and code a result was measured on, the
CoNLL-2003 sentences they run on, and how their results are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
CONLL = REPO / "assets" / "conll2003"


def alternating_rounds(
    script: str, checkouts: list[Path], rounds: int, arguments: Callable[[Path], list[str]]
) -> dict[str, list[Any]]:
    """The side-by-side scripts' rounds: each round runs `script` once per checkout, the
    checkouts alternating, each in a fresh process with `arguments(checkout)` and the checkout
    on PYTHONPATH (its spacy_elmo); by checkout, the JSON value each run printed last."""
    results: dict[str, list[Any]] = {}
    for _ in range(rounds):
        for checkout in checkouts:
            command = [sys.executable, "-W", "ignore", script, *arguments(checkout)]
            env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
            output = subprocess.run(
                command, check=True, capture_output=True, text=True, env=env
            ).stdout
            results.setdefault(str(checkout), []).append(json.loads(output.splitlines()[-1]))
    return results


def conll_words(split: str, limit: int | None = None) -> list[list[str]]:
    """The words of the first `limit` sentences (all if None) of CoNLL-2003 `split`.txt."""
    from workflow.conll import read_words

    return read_words(CONLL / f"{split}.txt", limit)


def conll_sentences(split: str, limit: int | None = None) -> list:
    """The first `limit` sentences (all if None) of CoNLL-2003 `split`.txt: lists of checked
    `conll.Token`s (word, tag, ner)."""
    from workflow.conll import read_sentences

    return read_sentences(CONLL / f"{split}.txt", limit)


def machine_info(*packages: str) -> dict:
    """The CPU, its cores and memory, the GPU when CUDA has one, Python and torch versions,
    date, platform and commit, and the installed version (None if absent) of each of
    `packages`, under its name with "_" for "-"."""
    import datetime
    import os
    import platform

    import torch

    from workflow.machine import cpu_fields, package_versions

    cpu = cpu_fields().get("model name", "unknown")
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
    for package, installed in package_versions(*packages).items():
        info[package.replace("-", "_")] = installed
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
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


def shown_path(path: Path) -> str:
    """A path relative to the repository when inside it (the results name no machine's path)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def write_results(output: Path, report: dict, text: str) -> None:
    """A benchmark's results: OUTPUT.json (the report) and OUTPUT.md (its Markdown `text`),
    their folder made if need be."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    output.with_suffix(".md").write_text(text)
