"""Ends the processes of a local Ray instance when its driver ends, however it ends (Linux).

Ray kills its raylet and GCS with the driver (kernel fate sharing), but the raylet's own
children (the dashboard and runtime-env agents) outlive a driver killed by SIGKILL. This
watchdog, started by the driver, notes the driver's new Ray descendants every half second; when
the driver is gone (its pipe to us closes) it kills those that are still running.

    python reaper.py DRIVER_PID   (stdin: a pipe from the driver; "+" on stdout when ready)
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

POLL_SECONDS = 0.5


def start_reaper() -> Optional[subprocess.Popen]:
    """Start the watchdog for this process (None where there is no /proc to watch)."""
    if not Path("/proc/self/stat").exists():
        return None
    reaper = subprocess.Popen(
        # the file itself, not the module: importing spacy_elmo would take seconds
        [sys.executable, "-S", __file__, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # not in the driver's process group: Ctrl-C does not reach it
    )
    reaper.stdout.read(1)  # it has noted the processes from before: Ray may start now
    return reaper


def stop_reaper(reaper: Optional[subprocess.Popen]) -> None:
    """The driver is done: the watchdog ends what is left of its processes, and exits."""
    if reaper is not None:
        reaper.stdin.close()
        try:
            reaper.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            reaper.kill()


def _stat(pid: int) -> Optional[tuple[int, int]]:
    """(parent pid, start time) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below `root`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
                starts[int(entry)] = stat[1]
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child != os.getpid():
                found[child] = starts[child]
                todo.append(child)
    return found


def _is_ray(pid: int) -> bool:
    try:
        return b"ray" in Path(f"/proc/{pid}/cmdline").read_bytes().lower()
    except OSError:
        return False


def watch(driver: int) -> None:
    earlier = _descendants(driver)  # the driver's own children from before: not ours to end
    os.write(sys.stdout.fileno(), b"+")
    seen: dict[int, int] = {}
    while True:
        for pid, start in _descendants(driver).items():
            if earlier.get(pid) != start and pid not in seen and _is_ray(pid):
                seen[pid] = start
        ready, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
        if ready and not os.read(sys.stdin.fileno(), 1024):
            break  # the pipe closed: the driver is done or dead
        if _stat(driver) is None:
            break
    for pid, start in seen.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == start:  # the same process, not a reused pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]))
