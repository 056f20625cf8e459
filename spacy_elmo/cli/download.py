"""`spacy-elmo download`: a published AllenNLP biLM into the cache (wiring `bilm.published`)."""

from __future__ import annotations

import typer

from . import _util as opt
from ._util import command


@command("download")
def download(
    name: str = typer.Argument(
        ..., help="The published biLM: small, medium, original or original-5.5b."
    ),
    force: bool = opt.force_option("the cached files (download them again)"),
    quiet: bool = opt.quiet_option(),
) -> None:
    """Download a published AllenNLP biLM into the cache (SPACY_ELMO_CACHE), resuming a cut
    transfer; SPACY_ELMO_MIRROR replaces the published base URL. Files already cached are
    verified against the sha256 recorded at their first download."""
    from ..bilm import published

    options_file, weights_file = published.download(name, force=force, progress=not quiet)
    typer.echo(
        f"{name}: {options_file.parent} ({options_file.name}, {weights_file.name}); use it as "
        f"--model {name}"
    )
