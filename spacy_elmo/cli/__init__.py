"""The `spacy-elmo` command line: one module per command, each wiring a library function."""

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


def main() -> None:
    app(prog_name="spacy-elmo")


__all__ = ["app", "main"]
