"""The processes a corpus run started, ended with it however it ends (Linux: /proc): a watchdog
notes the driver's new descendants every half second and kills them once the driver is gone
(its pipe closes), even after a SIGKILL.

    python reaper.py DRIVER_PID   (stdin: a pipe from the driver; "+" on stdout when ready)
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

POLL_SECONDS = 0.5
END_WAIT_SECONDS = 10.0  # how long `end_processes` waits for the processes it killed


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


def _stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state letter, parent pid, start time) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: Optional[int] = None) -> dict[int, int]:
    """pid -> start time of every process below `root` (default: this one); empty where there
    is no /proc to read."""
    root = os.getpid() if root is None else root
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc") if Path("/proc/self/stat").exists() else []:
        stat = _stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            children.setdefault(stat[1], []).append((int(entry), stat[2]))
    found, todo = {}, [root]
    while todo:
        for child, start in children.get(todo.pop(), []):
            if child not in found and child != os.getpid():
                found[child] = start
                todo.append(child)
    return found


def _running(pid: int, start: int) -> bool:
    """Whether the process `pid` that started at `start` (not a reused pid) still runs."""
    stat = _stat(pid)
    return stat is not None and stat[2] == start and stat[0] not in ("Z", "X")


def end_processes(processes: dict[int, int], wait: float = END_WAIT_SECONDS) -> list[int]:
    """SIGKILL each of `processes` (pid -> start time) still running and wait, at most `wait`
    seconds, until each is gone (this process's own children are reaped); the pids left."""
    left = {pid: start for pid, start in processes.items() if _running(pid, start)}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                os.waitpid(pid, os.WNOHANG)  # ours: reaped; another's: ChildProcessError
            except ChildProcessError:
                pass
            if not _running(pid, left[pid]):
                del left[pid]
        time.sleep(0.02)
    return sorted(left)


def watch(driver: int) -> None:
    earlier = descendants(driver)  # the driver's children from before: not the run's to end
    os.write(sys.stdout.fileno(), b"+")
    seen: dict[int, int] = {}
    while _stat(driver) is not None:
        for pid, start in descendants(driver).items():
            if earlier.get(pid) != start:
                seen.setdefault(pid, start)
        ready, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
        if ready and not os.read(sys.stdin.fileno(), 1024):
            break  # the pipe closed: the driver is done or dead
    end_processes(seen, wait=0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]))
