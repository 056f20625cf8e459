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
import time
from pathlib import Path
from typing import Optional

POLL_SECONDS = 0.5
# How long `end_processes` waits for the processes it killed to be gone.
END_WAIT_SECONDS = 10.0


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


def _state(pid: int) -> Optional[tuple[str, int, int]]:
    """(state letter, process group, start time) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[19])


def own_processes() -> dict[int, int]:
    """pid -> start time of every process below this one, and of Ray's processes in its process
    group (Ray starts its processes in the driver's group, where the raylet's children stay
    when it is gone). Empty where there is no /proc to read."""
    if not Path("/proc/self/stat").exists():
        return {}
    found = _descendants(os.getpid())
    group = os.getpgid(0)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            state = _state(int(entry))
            if state is not None and state[1] == group and _is_ray(int(entry)):
                found.setdefault(int(entry), state[2])
    return found


def end_processes(processes: dict[int, int], wait: float = END_WAIT_SECONDS) -> list[int]:
    """Kill (SIGKILL) each of `processes` (pid -> start time) still running and wait, at most
    `wait` seconds, until each is gone (a zombie whose parent is not this process counts as
    gone: it runs no more; this process's own are reaped). The pids still running after."""
    left = {pid: start for pid, start in processes.items() if _running(pid, start)}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while left:
        for pid in list(left):
            try:
                os.waitpid(pid, os.WNOHANG)  # ours: reaped; another's: ChildProcessError
            except ChildProcessError:
                pass
            if not _running(pid, left[pid]):
                del left[pid]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return sorted(left)


def _running(pid: int, start: int) -> bool:
    """Whether the process `pid` that started at `start` (not a reused pid) still runs."""
    state = _state(pid)
    return state is not None and state[2] == start and state[0] not in ("Z", "X")


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
