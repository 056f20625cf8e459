"""The `spacy-elmo` command line: one module per command, each wiring a library function."""

import typer

from .. import __version__
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
from ._util import app


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"spacy-elmo {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the version of spacy-elmo and exit.",
    ),
) -> None:  # fmt: skip
    """ELMo contextual word vectors for spaCy."""


def main() -> None:
    app(prog_name="spacy-elmo")


__all__ = ["app", "main"]
