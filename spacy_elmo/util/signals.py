"""Ctrl-C (SIGINT) and SIGTERM end a command cleanly, wherever they land: one line on standard
error ("interrupted", "terminated"), the exit code 130 or 143, temporary files removed and the
processes the command started ended first. (No spaCy, no torch, no typer: the floor.)

Three layers, from the first line of the process to its last:

* `exit_on_signals()`, called first by the entry point, before its imports (torch and spaCy take
  seconds): a signal prints its line and ends the process at once. Nothing needs cleaning up
  then; it is also what handles a signal once the command has returned.
* `StopOnSignal`, while the command runs: a signal raises KeyboardInterrupt or `Terminated`
  where the command is, so that its `finally` blocks run (SIGTERM's default would kill the
  process without them), and is recorded (`ended_by`), so that the command never ends with 0
  after one, wherever it landed.
* `shielded()`, a block that a signal must not cut short (the end of a Ray instance): the
  signal is recorded, and raised when the block is done.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional


class Terminated(BaseException):
    """SIGTERM, raised where the command is so that its cleanup runs."""


# What each signal raises where the command is, the line it prints and its exit code.
STOPS = {
    signal.SIGINT: (KeyboardInterrupt, "interrupted", 130),
    signal.SIGTERM: (Terminated, "terminated", 143),
}
# How long after a swallowed signal exception the signal is delivered again.
REDELIVERY_SECONDS = 0.05


def _exit_now(signum: int, frame: object) -> None:
    """Before and after the command: the signal's line, then its exit code, at once."""
    _, line, code = STOPS[signum]
    try:
        os.write(2, f"{line}\n".encode())
    finally:
        os._exit(code)


def exit_on_signals() -> None:
    """From now on (until a command's `StopOnSignal`), SIGINT and SIGTERM print their line and
    end the process with 130 or 143. A SIGINT that the process ignores (a background job) is
    left ignored. Only on the main thread (elsewhere Python has no handlers to set)."""
    if not _is_main_thread():
        return
    for number in STOPS:
        if number == signal.SIGINT and signal.getsignal(number) is not signal.default_int_handler:
            continue
        signal.signal(number, _exit_now)


def signal_behind(error: Optional[BaseException]) -> Optional[tuple[str, int]]:
    """("interrupted", 130) or ("terminated", 143) when `error` was caused by Ctrl-C or SIGTERM:
    raised by the handler while a C extension ran (Ray's wait, say), it comes out as the cause
    of a SystemError ("returned a result with an exception set")."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for raised, line, code in STOPS.values():
            if isinstance(error, raised):
                return line, code
        error = error.__cause__ or error.__context__
    return None


# The StopOnSignal of the running command, and how many `shielded` blocks are open.
_active: Optional[StopOnSignal] = None
_shields = 0


class StopOnSignal:
    """While a command runs (`with StopOnSignal() as stops:`), SIGINT and SIGTERM raise
    KeyboardInterrupt and `Terminated` where the command is, and are recorded.

    Where the exception cannot propagate (the signal landed in a finalizer or a weakref
    callback: Python prints "Exception ignored" and carries on), the signal is delivered again
    a moment later, until it lands where it ends the command; and a recorded signal is the
    command's exit code whatever happens after it (`ended_by`). A SIGINT that the process
    ignores (a background job) or that the caller handles its own way is left alone.
    """

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self.previous: dict[int, Any] = {}
        self.active = False
        self.lock = threading.Lock()

    def __enter__(self) -> StopOnSignal:
        global _active
        if not _is_main_thread():
            return self
        self.active = True
        for number in STOPS:
            current = signal.getsignal(number)
            ours = current in (signal.default_int_handler, _exit_now)
            if number == signal.SIGINT and not ours:  # ignored, or the caller's own handler
                continue
            self.previous[number] = signal.signal(number, self._raise)
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        self.outer, _active = _active, self
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if not self.active:
            return
        with self.lock:  # no delivery after this: one already made is pending on the main thread
            self.active = False
        _handle_pending_signals()  # by `_raise`, now recording only
        _active = self.outer
        sys.unraisablehook = self.previous_hook
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def ended_by(self) -> Optional[tuple[str, int]]:
        """The line and exit code of the signal received while the command ran, if one was."""
        return None if self.received is None else STOPS[self.received][1:]

    def _raise(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum
        if self.active and not _shields:
            raise STOPS[signum][0]()

    def _unraisable(self, unraisable: Any) -> None:
        """A signal's exception swallowed where it landed: deliver the signal again (soon, not
        here: this is still inside the finalizer), and say nothing of it."""
        if self.received is not None and isinstance(
            unraisable.exc_value, tuple(raised for raised, _, _ in STOPS.values())
        ):
            timer = threading.Timer(REDELIVERY_SECONDS, self._deliver_again)
            timer.daemon = True
            timer.start()
            return
        self.previous_hook(unraisable)

    def _deliver_again(self) -> None:
        with self.lock:
            if not self.active or self.received is None:
                return
            if sys.version_info >= (3, 10):
                import _thread

                _thread.interrupt_main(self.received)  # runs `_raise` on the main thread
            else:
                signal.pthread_kill(threading.main_thread().ident, self.received)


@contextmanager
def shielded() -> Iterator[None]:
    """A block that SIGINT and SIGTERM do not cut short: while it runs they are recorded only,
    and the first is raised when it ends (unless an exception already leaves it)."""
    global _shields
    if not _is_main_thread():
        yield
        return
    _shields += 1
    try:
        yield
    finally:
        _shields -= 1
    stops = _active
    if stops is not None and stops.active and stops.received is not None and not _shields:
        raise STOPS[stops.received][0]()


@contextmanager
def handlers_kept() -> Iterator[None]:
    """While the block runs (`ray.init`), SIGINT and SIGTERM keep their handlers: an attempt to
    replace them (Ray's, which ends the process with `sys.exit(15)`, without the command's
    cleanup and exit code) is ignored, and those set by C code (Ray's core worker: a report,
    then abort) are replaced by them again when it ends. Only on the main thread."""
    if not _is_main_thread():
        yield
        return
    replace = signal.signal

    def keep(number: int, handler: Any) -> Any:
        if number in STOPS:
            return signal.getsignal(number)
        return replace(number, handler)

    kept = {number: signal.getsignal(number) for number in STOPS}
    signal.signal = keep
    try:
        yield
    finally:
        signal.signal = replace
        for number, handler in kept.items():  # over one set in C (Ray's core worker's)
            if handler is not None:
                signal.signal(number, handler)


def _handle_pending_signals() -> None:
    """A Python-level call: the main thread runs the handlers of signals already received."""
    time.sleep(0)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
