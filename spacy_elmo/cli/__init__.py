"""The `spacy-elmo` command line: one module per command, each wiring a library function.
`main` handles signals (util/signals.py) before the commands' slow imports of torch and spaCy."""

from __future__ import annotations

from typing import Any


def main() -> None:
    from ..util import signals

    signals.handle_signals()
    try:
        _app()(prog_name="spacy-elmo")
    except signals.Stopped as stopped:  # before or after a command (which ends its own)
        import sys

        sys.stderr.write(f"{signals.LINES[stopped.signum]}\n")
        sys.exit(128 + stopped.signum)


def _app() -> Any:
    """The app with every command registered (each module registers its own)."""
    from . import (  # noqa: F401 - each module registers its command on `app`
        apply,
        debug_model,
        download,
        embed,
        embed_corpus,
        init_config,
        perplexity,
        pretrain,
        probe,
    )
    from .command import app

    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
