"""What every `spacy-elmo` command shares: the app, one error handler, one option vocabulary.

Options mean the same in every command (docs/cli.md):

* `--model/-m` names a biLM in any of the ways `weights.sources.resolve_source` takes;
  `--options/--weights` name a bilm-tf/AllenNLP pair instead.
* `--lang/-l` is the language of the tokenizer for raw text, `--pipeline/-p` a spaCy pipeline
  whose tokenizer and sentence boundaries read it instead (in `init-config`, as in `spacy init
  config`, the list of components); `--pretokenized/--raw` says which kind of text the input is.
* `--code/-c` is a Python file imported first, as in spaCy's commands (every command that loads
  a pipeline or config).
* `--batch-size/-b` counts sentences (documents for `apply`); `--threads/-t` torch CPU threads;
  `--gpu-id/-g` a CUDA device (-1: the CPU).
* A required output is the last argument; an optional one is `--output/-o`. `--force/-F`
  replaces an existing output; `--quiet/-q` hides the progress bar (or progress lines).
"""

from __future__ import annotations

import configparser
import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import typer

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


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command with `error: message` on standard error."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


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


def command(name: str, **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `function` as the command `name`; every error it raises ends in one line.

    ValueError, OSError, ImportError and config errors are the user's to fix: `error: <what>`,
    exit code 1. Anything else is a fault of spacy-elmo: one line naming it, exit code 2, and
    the traceback when SPACY_ELMO_TRACEBACK=1. Ctrl-C and SIGTERM end the command with 130 and
    143 after its temporary files are removed (they are written in `try` blocks that clean up),
    wherever the signal lands (`_StopOnSignal`).
    """

    def register(function: Callable[..., Any]) -> Callable[..., Any]:
        run = guard(name, function)
        settings.setdefault("context_settings", {}).update(CONTEXT)
        app.command(name, **settings)(run)
        return function

    return register


def guard(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` as the command `name` runs it: errors and signals end it as `command` says."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        stops = _StopOnSignal()
        try:
            with stops:
                result = function(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except (KeyboardInterrupt, _Terminated) as error:
            _end_by_signal(_signal_behind(error))
        except _user_errors() as error:
            _end_by_signal(stops.ended_by())
            fail(_message(error))
        except Exception as error:  # noqa: BLE001 - the one place that reports faults
            # raised inside an extension's call (a SystemError), or after a signal
            _end_by_signal(_signal_behind(error) or stops.ended_by())
            if os.environ.get(TRACEBACK_VARIABLE) == "1":
                raise
            fail(
                f"internal error in `spacy-elmo {name}` ({type(error).__name__}: "
                f"{_message(error)}); set {TRACEBACK_VARIABLE}=1 for the traceback and "
                "please report it",
                code=2,
            )
        # A signal whose exception was swallowed where it landed: never an exit code of 0.
        _end_by_signal(stops.ended_by())
        return result

    return run


class _Terminated(BaseException):
    """SIGTERM, raised where the command is so that its cleanup runs."""


# What each signal raises where the command is, the line it prints and its exit code.
_STOPS = {
    signal.SIGINT: (KeyboardInterrupt, "interrupted", 130),
    signal.SIGTERM: (_Terminated, "terminated", 143),
}
# How long after a swallowed signal exception the signal is delivered again.
REDELIVERY_SECONDS = 0.05


def _end_by_signal(ended: Optional[tuple[str, int]]) -> None:
    """End the command with the signal's line and exit code, if a signal ended it."""
    if ended is not None:
        typer.echo(ended[0], err=True)
        raise typer.Exit(code=ended[1])


def _signal_behind(error: BaseException) -> Optional[tuple[str, int]]:
    """("interrupted", 130) or ("terminated", 143) when `error` was caused by Ctrl-C or SIGTERM:
    raised by the handler while a C extension ran (Ray's wait, say), it comes out as the cause of
    a SystemError ("returned a result with an exception set")."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for raised, line, code in _STOPS.values():
            if isinstance(error, raised):
                return line, code
        error = error.__cause__ or error.__context__
    return None


class _StopOnSignal:
    """While a command runs, SIGINT and SIGTERM raise KeyboardInterrupt and `_Terminated` where
    the command is, so that its cleanup runs (SIGTERM's default would kill the process without
    it), and are recorded.

    Where the exception cannot propagate (the signal landed in a finalizer or a weakref
    callback: Python prints "Exception ignored" and carries on), the signal is delivered again
    a moment later, until it lands where it ends the command; and a recorded signal is the
    command's exit code whatever happens after it (`ended_by`), so a command never ends with 0
    after a signal, wherever it landed. A SIGINT that the process ignores (a background job) or
    handles its own way is left alone.
    """

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self.previous: dict[int, Any] = {}
        self.active = False
        self.lock = threading.Lock()

    def __enter__(self) -> _StopOnSignal:
        if not _is_main_thread():
            return self
        self.active = True
        for number in _STOPS:
            own = signal.getsignal(number) is not signal.default_int_handler
            if number == signal.SIGINT and own:  # ignored, or the caller's own handler
                continue
            self.previous[number] = signal.signal(number, self._raise)
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.previous:
            return
        with self.lock:  # no delivery after this: one already made is pending on the main thread
            self.active = False
        _handle_pending_signals()  # by `_raise`, now recording only
        sys.unraisablehook = self.previous_hook
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def ended_by(self) -> Optional[tuple[str, int]]:
        """The line and exit code of the signal received while the command ran, if one was."""
        return None if self.received is None else _STOPS[self.received][1:]

    def _raise(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signum
        if self.active:
            raise _STOPS[signum][0]()

    def _unraisable(self, unraisable: Any) -> None:
        """A signal's exception swallowed where it landed: deliver the signal again (soon, not
        here: this is still inside the finalizer), and say nothing of it."""
        if self.received is not None and isinstance(
            unraisable.exc_value, tuple(raised for raised, _, _ in _STOPS.values())
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


def _handle_pending_signals() -> None:
    """A Python-level call: the main thread runs the handlers of signals already received."""
    time.sleep(0)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


# -------------------------------------------------------------------------- shared options
def model_option(help_extra: str = "") -> Any:
    return typer.Option(
        "bundled",
        "--model",
        "-m",
        help="The biLM: 'bundled', a published name (small, medium, original, original-5.5b; "
        "after `spacy-elmo download NAME`), a BiLM.save directory, a `spacy-elmo pretrain` run "
        "directory, a bilm-tf/AllenNLP folder or an ELMoForManyLangs directory." + help_extra,
    )


def options_option() -> Any:
    return typer.Option(
        None, "--options", help="bilm-tf/AllenNLP options.json (with --weights, not --model)."
    )


def weights_option() -> Any:
    return typer.Option(
        None, "--weights", help="bilm-tf/AllenNLP weights hdf5 (with --options, not --model)."
    )


def lang_option() -> Any:
    return typer.Option(
        None,
        "--lang",
        "-l",
        help="Language of the tokenizer for raw text (en when none is named); naming one "
        "means the input is raw text.",
        show_default=False,
    )


def pipeline_option() -> Any:
    return typer.Option(
        None,
        "--pipeline",
        "-p",
        help="spaCy pipeline (installed name or path) whose tokenizer and sentence boundaries "
        "read raw text, instead of --lang.",
    )


def pretokenized_option(default: bool) -> Any:
    return typer.Option(
        None,
        "--pretokenized/--raw",
        help="Lines are whitespace-separated tokens, or raw text that --lang/--pipeline "
        + (
            "tokenises. Default: --pretokenized, or --raw when --lang or --pipeline is given."
            if default
            else "tokenises. Default: --raw."
        ),
        show_default=False,
    )


def is_pretokenized(
    pretokenized: Optional[bool], lang: Optional[str], pipeline: Optional[str], default: bool
) -> bool:
    """Whether the input is pre-tokenised: as given, else raw when a tokenizer is named, else
    the command's default. A tokenizer named for pre-tokenised input is a contradiction."""
    named = lang is not None or pipeline is not None
    if pretokenized is None:
        return False if named else default
    if pretokenized and named:
        raise ValueError(
            "--lang/--pipeline name a tokenizer for raw text, but --pretokenized says the lines "
            "are already tokens (split on spaces): give one or the other"
        )
    return pretokenized


def code_option() -> Any:
    return typer.Option(
        None,
        "--code",
        "-c",
        help="Python file imported first, as in spaCy's commands: the registered functions, "
        "components or languages that a pipeline or config names.",
        show_default=False,
    )


def import_code(code: Optional[Path]) -> None:
    """Import `--code` (a Python file) so that what it registers is there for spaCy."""
    if code is None:
        return
    import spacy.util

    path = Path(code)
    if not path.is_file():
        raise FileNotFoundError(f"--code {code}: no such Python file")
    spacy.util.import_file("python_code", path)


def top_option() -> Any:
    return typer.Option(False, "--top", help="Write only the top layer, (n, D).")


def average_option() -> Any:
    return typer.Option(False, "--average", help="Write the layer average, (n, D).")


def float16_option() -> Any:
    return typer.Option(
        False,
        "--float16",
        help="Store half precision: half the size, each value within a relative 2^-11 "
        "(4.9e-4) of float32.",
    )


def compression_option() -> Any:
    return typer.Option(
        None,
        "--compression",
        callback=check_compression,
        help="Compress each dataset: gzip (level 4) or lzf; lossless, slower to write and read.",
    )


def check_compression(value: Optional[str]) -> Optional[str]:
    """--compression is one of the compressions embed_file writes (refused before any work)."""
    if value is not None:
        from ..corpus.embed_file import COMPRESSIONS

        if value not in COMPRESSIONS:
            raise typer.BadParameter(
                f"{value!r} is not one of {', '.join(map(repr, COMPRESSIONS))}"
            )
    return value


def batch_size_option(default: int = 64, unit: str = "sentences") -> Any:
    return typer.Option(default, "--batch-size", "-b", min=1, help=f"{unit.capitalize()} a batch.")


def bf16_option() -> Any:
    return typer.Option(
        False,
        "--bf16",
        help="Run the biLM's LSTM products in bfloat16 (CPU only; the bundled biLM's vectors "
        "differ from float32 by about 0.2% of their norm; faster only on a CPU with AMX or "
        "AVX-512 BF16, slower elsewhere: docs/performance.md#bfloat16-on-the-cpu).",
    )


def threads_option(default: Optional[int] = None) -> Any:
    """--threads/-t, which the command hands to `util.threads.use_threads`."""
    said = (
        " (default: torch's, at most the CPUs this process may use: its cores, fewer under a "
        "container's CPU quota)"
        if default is None
        else ""  # typer shows the default
    )
    return typer.Option(
        default,
        "--threads",
        "-t",
        help=f"torch CPU threads{said}. Where other jobs keep cores busy, 1 "
        "(docs/performance.md#threads-on-a-shared-machine).",
    )


def gpu_option() -> Any:
    return typer.Option(-1, "--gpu-id", "-g", help="CUDA device, -1 for the CPU.")


def quiet_option(what: str = "No progress bar.") -> Any:
    return typer.Option(False, "--quiet", "-q", help=what)


def force_option(what: str = "an existing output") -> Any:
    return typer.Option(False, "--force", "-F", help=f"Replace {what}.")


# -------------------------------------------------------------------------- shared wiring
def tokenizer_name(lang: Optional[str], pipeline: Optional[str]) -> str:
    """What reads raw text: the pipeline when one is named, else the language (en)."""
    return pipeline if pipeline else lang or "en"


def device(gpu_id: int) -> str:
    """The torch device of `--gpu-id`; ValueError when that GPU is not there. The one check of
    a GPU for every command, made before any work (and before spaCy's "Using GPU")."""
    if gpu_id < 0:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            f"--gpu-id {gpu_id}: no CUDA device is available on this machine (use -1 for the CPU)"
        )
    if gpu_id >= torch.cuda.device_count():
        raise ValueError(
            f"--gpu-id {gpu_id}: only {torch.cuda.device_count()} CUDA device(s) are available "
            f"(ids 0 to {torch.cuda.device_count() - 1}; -1 for the CPU)"
        )
    return f"cuda:{gpu_id}"


def check_new_output(path: Path, force: bool, inputs: list[Path]) -> None:
    """Refuse an output that exists (unless `force`), is an input or cannot be written."""
    from ..util.files import check_output

    check_output(path, inputs)
    if path.exists() and not force:
        raise ValueError(f"output {path} exists; use --force to replace it")
