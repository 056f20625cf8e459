"""`spacy-elmo download`: a published AllenNLP biLM into the cache (wiring `weights.published`)."""

from __future__ import annotations

import typer

from . import _util as opt
from ._util import command


@command("download")
def download(
    name: str = typer.Argument(
        ..., help="The published biLM: small, medium, original or original-5.5b."
    ),
    force: bool = opt.force_option(
        "the cached files and their record (download, check and record them again)"
    ),
    quiet: bool = opt.quiet_option(),
) -> None:
    """Download a published AllenNLP biLM into the cache (SPACY_ELMO_CACHE), resuming a cut
    transfer. SPACY_ELMO_MIRROR (an http(s):// or file:// URL, or a folder) replaces the
    published base URL; a transfer that receives nothing for SPACY_ELMO_DOWNLOAD_TIMEOUT
    seconds (default 60) stops. A file is recorded (size, sha256) only once it checks whole
    against the name's architecture; cached files are verified against that record, and
    --force downloads them again and replaces it."""
    from ..weights import published

    cached = not force and published.cached_files(name) is not None
    options_file, weights_file = published.download(name, force=force, progress=not quiet)
    state = (
        "already downloaded, verified against"
        if cached
        else "downloaded and checked whole, size and sha256 in"
    )
    typer.echo(
        f"{name}: {state} {options_file.parent / published.RECORD_NAME}; {options_file.name} "
        f"and {weights_file.name} are in {options_file.parent}; use it as --model {name}"
    )
