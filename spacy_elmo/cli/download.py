"""`spacy-elmo download`: a published AllenNLP biLM into the cache (wiring `weights.published`)."""

from __future__ import annotations

from typing import Optional

import typer

from . import _util as opt
from .command import command


@command("download")
def download(
    name: str = typer.Argument(
        ..., help="The published biLM: small, medium, original or original-5.5b."
    ),
    force: bool = opt.force_option(
        "the cached files and their record (download, check and record them again)"
    ),
    speed_limit: Optional[float] = typer.Option(
        None,
        "--speed-limit",
        help="Stop a transfer slower than this many bytes a second over --speed-time (0: no "
        "limit). Default: SPACY_ELMO_DOWNLOAD_SPEED_LIMIT, else 1024.",
    ),
    speed_time: Optional[float] = typer.Option(
        None,
        "--speed-time",
        help="Seconds a transfer may stay below --speed-limit. Default: "
        "SPACY_ELMO_DOWNLOAD_SPEED_TIME, else 30.",
    ),
    quiet: bool = opt.quiet_option(),
) -> None:
    """Download a published AllenNLP biLM into the cache (SPACY_ELMO_CACHE), resuming a cut
    transfer only while the server promises the same file (If-Range on its ETag or
    Last-Modified; otherwise from byte 0). SPACY_ELMO_MIRROR (an http(s):// URL) replaces the
    published base URL.
    A transfer stops when it receives nothing for SPACY_ELMO_DOWNLOAD_TIMEOUT seconds (default
    60) or stays below --speed-limit for --speed-time; its .part is kept for the next run. A
    file is recorded (size, sha256) only once it checks whole against the name's
    architecture; cached files are verified against that record, and --force downloads them
    again and replaces it."""
    from ..util.download import RECORD_NAME
    from ..weights import published

    cached = not force and published.cached_files(name) is not None
    options_file, weights_file = published.download(
        name, force=force, progress=not quiet, speed_limit=speed_limit, speed_time=speed_time
    )
    state = (
        "already downloaded, verified against"
        if cached
        else "downloaded and checked whole, size and sha256 in"
    )
    typer.echo(
        f"{name}: {state} {options_file.parent / RECORD_NAME}; {options_file.name} "
        f"and {weights_file.name} are in {options_file.parent}; use it as --model {name}"
    )
