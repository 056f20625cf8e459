"""What the `spacy-elmo` subcommands share: loading a biLM from CLI options, failing cleanly.

Its own module so that the subcommand modules (probe_cli, ...) and cli.py, which registers
them, do not import each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def load_bilm(
    model: Optional[Path], options: Optional[Path], weights: Optional[Path], stateful: bool = False
):
    """A biLM from a saved directory, an ELMoForManyLangs model directory (char.dic +
    encoder.pkl) or options.json + weights hdf5."""
    from .bilm import BiLM
    from .bilm.elmoformanylangs import is_elmoformanylangs_dir

    if model is not None and (options is not None or weights is not None):
        raise ValueError("give either --model or --options/--weights, not both")
    if model is not None:
        if is_elmoformanylangs_dir(model):
            return BiLM.from_elmoformanylangs(model, stateful=stateful)
        return BiLM.load(model, stateful=stateful)
    if options is not None and weights is not None:
        return BiLM.from_allennlp(options, weights, stateful=stateful)
    if options is not None or weights is not None:
        raise ValueError("--options and --weights must be given together")
    from .loaders import bundled_bilm

    return bundled_bilm(stateful=stateful)


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)
