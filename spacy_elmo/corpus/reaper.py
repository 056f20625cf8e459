"""The processes a corpus run started, ended with it however it ends: a watchdog notes the
driver's new descendants every half second and kills them once the driver is done (its pipe
closes), even after a SIGKILL. A process is known by its pid and start time (psutil.Process),
so a reused pid is never killed.

    python reaper.py DRIVER_PID   (stdin: a pipe from the driver; "+" on stdout when ready)
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from contextlib import suppress
from typing import Iterable, Optional

import psutil

POLL_SECONDS = 0.5
END_WAIT_SECONDS = 10.0  # how long `end_processes` waits for the processes it killed


def start_reaper() -> subprocess.Popen:
    """Start the watchdog of this process: what starts below it from now on is ended when
    `stop_reaper` is called or this process dies."""
    reaper = subprocess.Popen(
        # the file itself, not the module: importing spacy_elmo would take seconds
        [sys.executable, __file__, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # not in the driver's process group: Ctrl-C does not reach it
    )
    reaper.stdout.read(1)  # it has noted the processes from before: Ray may start now
    return reaper


def stop_reaper(reaper: Optional[subprocess.Popen]) -> None:
    """The run is done: the watchdog ends what is left of its processes, waits until they are
    gone, and exits."""
    if reaper is not None:
        reaper.stdin.close()
        try:
            reaper.wait(timeout=END_WAIT_SECONDS + 20)
        except subprocess.TimeoutExpired:  # pragma: no cover
            reaper.kill()


def descendants(root: Optional[int] = None) -> set[psutil.Process]:
    """Every process below `root` (default: this one), but this one."""
    try:
        found = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {process for process in found if process.pid != os.getpid()}


def end_processes(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each of `processes` still running and wait, at most END_WAIT_SECONDS, until each
    is gone (a zombie counts as gone: its parent, the driver, reaps it)."""
    left = list(processes)
    for process in left:
        with suppress(psutil.Error):
            process.kill()  # not a reused pid: psutil checks the start time
    deadline = time.monotonic() + END_WAIT_SECONDS
    while any(_alive(process) for process in left) and time.monotonic() < deadline:
        time.sleep(0.02)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(driver: int) -> None:
    earlier = descendants(driver)  # the driver's children from before: not the run's to end
    os.write(sys.stdout.fileno(), b"+")
    seen: set[psutil.Process] = set()
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], POLL_SECONDS)
        closed = bool(ready) and not os.read(sys.stdin.fileno(), 1024)  # the driver is done
        seen |= descendants(driver) - earlier  # once more when it is done: the latest
        if closed or not psutil.pid_exists(driver):
            break
    end_processes(seen)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]))
