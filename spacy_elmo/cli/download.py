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

    cached = not force and published.cached_files(name) is not None
    options_file, weights_file = published.download(name, force=force, progress=not quiet)
    state = "already downloaded, verified against" if cached else "downloaded, size and sha256 in"
    typer.echo(
        f"{name}: {state} {options_file.parent / published.RECORD_NAME}; {options_file.name} "
        f"and {weights_file.name} are in {options_file.parent}; use it as --model {name}"
    )
