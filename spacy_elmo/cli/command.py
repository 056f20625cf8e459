"""The `spacy-elmo` app and how every command ends: an error in one line, a signal with its code.

ValueError, OSError, ImportError and config errors are the user's to fix: `error: <what>`, exit
code 1. Anything else is a fault of spacy-elmo: one line naming it, exit code 2, and the
traceback when SPACY_ELMO_TRACEBACK=1. A signal (`util.signals`: Ctrl-C, SIGTERM, SIGHUP) ends
the command with one line and 128 + its number, after its cleanup has run.
"""

from __future__ import annotations

import configparser
import functools
import os
import signal
from typing import Any, Callable, NoReturn, Optional

import typer

from .. import __version__
from ..util import signals

# Help is never cut at 80 columns.
CONTEXT = {"max_content_width": 120, "help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="spacy-elmo",
    help="ELMo contextual word vectors for spaCy.",
    no_args_is_help=True,
    context_settings=CONTEXT,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# Set to see the traceback of an unexpected error instead of its one-line summary.
TRACEBACK_VARIABLE = "SPACY_ELMO_TRACEBACK"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"spacy-elmo {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version of spacy-elmo and exit.",
    ),
) -> None:
    """ELMo contextual word vectors for spaCy."""


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command with `error: message` on standard error."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def command(name: str, **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `function` as the command `name`; every error it raises ends in one line, and
    a signal with its line and exit code (`guard`)."""

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        app.command(name, **settings)(guard(name, function))
        return function

    return register


def guard(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` as the command `name` runs it: errors and signals end it as the module says."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        signals.forget()
        try:
            result = function(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            end_if_signalled()  # a signal received meanwhile is still the exit code
            raise
        except BaseException as error:  # noqa: BLE001 - the one place that reports faults
            end_if_signalled(error)
            if not isinstance(error, Exception):
                raise
            if isinstance(error, _user_errors()):
                fail(_message(error))
            if os.environ.get(TRACEBACK_VARIABLE) == "1":
                raise
            fail(
                f"internal error in `spacy-elmo {name}` ({type(error).__name__}: "
                f"{_message(error)}); set {TRACEBACK_VARIABLE}=1 for the traceback and "
                "please report it",
                code=2,
            )
        end_if_signalled()  # a signal whose exception was swallowed where it landed
        return result

    return run


def end_if_signalled(error: Optional[BaseException] = None) -> None:
    """End the command with the signal's line and exit code if a signal was received (or
    `error` is Ctrl-C's KeyboardInterrupt, where no handler of ours was set)."""
    ended = signals.received()
    if ended is None and isinstance(error, KeyboardInterrupt):
        ended = (signals.LINES[signal.SIGINT], 128 + signal.SIGINT)
    if ended is not None:
        typer.echo(ended[0], err=True)
        raise typer.Exit(code=ended[1])


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user's input can cause: bad values and files, missing packages, bad configs."""
    from confection import ConfigValidationError

    return (ValueError, OSError, ImportError, configparser.Error, ConfigValidationError)


def _message(error: BaseException) -> str:
    """The error on one line."""
    text = str(error).strip() or type(error).__name__
    if isinstance(error, OSError) and error.filename and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return "; ".join(line for line in lines if line)
