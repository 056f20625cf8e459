"""SIGINT, SIGTERM and SIGHUP (a dropped ssh session) end a command cleanly: its cleanup runs
(temporary files removed, the processes it started ended), then one line on standard error and
the exit code 128 + the signal's number.

`handle_signals()`, called once first thing in the entry point, makes each signal raise
`Stopped` where the program is, so that `finally` blocks run (SIGTERM's and SIGHUP's default
would end the process without them), and records it (`received`): the command never ends with
0 after one. A block that a signal must not cut short (Ray starting or ending), or where the
raise would be lost (inside a finalizer, which h5py runs often), runs under `deferred()`; a
signal meanwhile is raised when the block is done. A loop that ends itself at
a safe point (pretraining, at a step boundary) asks `pending()` there and `drop_pending()`s it.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

LINES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


class Stopped(BaseException):
    """A stop signal (`signum`), raised where the program was."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_state = {"received": None, "pending": None, "deferring": 0}


def handle_signals() -> None:
    """From now on SIGINT, SIGTERM and SIGHUP raise `Stopped`; one that the process was
    started to ignore (a background job's SIGINT, `nohup`'s SIGHUP) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in LINES:
        if signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, _stop)


def _stop(signum: int, frame: object) -> None:
    _state["received"] = _state["received"] or signum
    if _state["deferring"]:
        _state["pending"] = _state["pending"] or signum
        return
    raise Stopped(signum)


def received() -> Optional[tuple[str, int]]:
    """The line and exit code of the first signal received, if one was."""
    number = _state["received"]
    return None if number is None else (LINES[number], 128 + number)


def forget() -> None:
    """A new command starts: no signal received yet."""
    _state.update(received=None, pending=None)


def pending() -> Optional[int]:
    """The number of the signal a `deferred()` block holds back, None if none came."""
    return _state["pending"]


def drop_pending() -> None:
    """The block has ended its work because of `pending()`: the signal is not raised when the
    block is done (the command still ends with its code, `received`)."""
    _state["pending"] = None


@contextmanager
def deferred() -> Iterator[None]:
    """A block that a signal does not cut short: the signal is raised when it is done (unless
    an exception already leaves it)."""
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        pending = None if _state["deferring"] else _state["pending"]
        _state["pending"] = None if pending else _state["pending"]
    if pending:
        raise Stopped(pending)
