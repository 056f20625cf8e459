"""The published AllenNLP/bilm-tf English biLMs by name: where they are, and their download.

`download(name)` fetches a model's options and weights files into the cache (`SPACY_ELMO_CACHE`)
from AllenNLP or `SPACY_ELMO_MIRROR` with `util.download.fetch`, and checks them against the
name's architecture (docs/download.md). Nothing here runs unless a user asks for a download
(`spacy-elmo download NAME`, `spacy_elmo.PublishedWeights.v1`); `sources` only reads the cache.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..util.download import (
    PART_SUFFIX,
    RETRIES,
    ChecksumError,
    DownloadError,
    Limits,
    fetch,
    read_record,
    verify,
)
from ..util.files import probe_writable

PUBLISHED_BASE_URL = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
CACHE_VARIABLE = "SPACY_ELMO_CACHE"
MIRROR_VARIABLE = "SPACY_ELMO_MIRROR"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


# The char CNN of every published biLM (spec §12): 2,048 filters over 16-dim characters.
PUBLISHED_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


@dataclass(frozen=True)
class PublishedModel:
    """A published biLM: its name here, its shape (the folder AllenNLP publishes it in), and
    the architecture its options file states: LSTM size D, projection P, highway layers."""

    name: str
    shape: str
    lstm_dim: int
    projection_dim: int
    n_highway: int

    @property
    def options_name(self) -> str:
        return f"elmo_{self.shape}_options.json"

    @property
    def weights_name(self) -> str:
        return f"elmo_{self.shape}_weights.hdf5"

    @property
    def file_names(self) -> tuple[str, str]:
        return (self.options_name, self.weights_name)

    @property
    def command(self) -> str:
        """The command that downloads this model, as the errors name it."""
        return f"spacy-elmo download {self.name}"

    @property
    def architecture(self) -> Any:
        """The `BiLMOptions` that its options file states, which every copy must match."""
        from ..description.options import BiLMOptions

        return BiLMOptions(
            char_embedding_dim=16,
            filters=PUBLISHED_FILTERS,
            n_highway=self.n_highway,
            activation="relu",
            lstm_dim=self.lstm_dim,
            projection_dim=self.projection_dim,
            n_layers=2,
            cell_clip=3.0,
            proj_clip=3.0,
            use_skip_connections=True,
        )

    def url(self, file_name: str, base: Optional[str] = None) -> str:
        return f"{(base or base_url()).rstrip('/')}/{self.shape}/{file_name}"

    def folder(self) -> Path:
        """Where the cache keeps this model's files."""
        return cache_dir() / self.shape


PUBLISHED = {
    model.name: model
    for model in (
        PublishedModel("small", "2x1024_128_2048cnn_1xhighway", 1024, 128, 1),
        PublishedModel("medium", "2x2048_256_2048cnn_1xhighway", 2048, 256, 1),
        PublishedModel("original", "2x4096_512_2048cnn_2xhighway", 4096, 512, 2),
        PublishedModel("original-5.5b", "2x4096_512_2048cnn_2xhighway_5.5B", 4096, 512, 2),
    )
}


def published_model(name: str) -> PublishedModel:
    """The published model called `name`; ValueError naming the choices otherwise."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown published biLM '{name}'; choose one of {', '.join(PUBLISHED)}")
    return PUBLISHED[name]


def base_url() -> str:
    """The base URL the files are fetched from: `SPACY_ELMO_MIRROR`, else AllenNLP's; a mirror
    that is not an http(s):// URL is a DownloadError naming it."""
    mirror = os.environ.get(MIRROR_VARIABLE, "").strip()
    if mirror and not mirror.lower().startswith(("http://", "https://")):
        raise DownloadError(
            f"{MIRROR_VARIABLE}={mirror!r} is not an http:// or https:// URL; a mirror is a web "
            "server holding the published <shape>/ folders (a cache folder served over HTTP)"
        )
    return mirror or PUBLISHED_BASE_URL


def cache_dir() -> Path:
    """The folder of downloaded biLMs: `SPACY_ELMO_CACHE`, else the user's cache directory."""
    configured = os.environ.get(CACHE_VARIABLE, "").strip()
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spacy-elmo"


def cached_files(name: str) -> Optional[tuple[Path, Path]]:
    """The options and weights files of `name` when both are in the cache, else None.
    A file whose size is not the recorded one is a ChecksumError (the cache was changed)."""
    model = published_model(name)
    folder = model.folder()
    paths = tuple(folder / file_name for file_name in model.file_names)
    if not all(path.is_file() for path in paths):
        return None
    record = read_record(folder, command=model.command)
    for path in paths:
        expected = record.get(path.name, {}).get("size")
        if expected is not None and path.stat().st_size != expected:
            raise ChecksumError(
                f"cached file {path} is {path.stat().st_size} bytes, {expected} when it was "
                f"downloaded; run `{model.command} --force` to download it again"
            )
    return paths  # type: ignore[return-value]


def ensure(name: str) -> tuple[Path, Path]:
    """The cached files of `name`, downloaded first when they are not in the cache."""
    return cached_files(name) or download(name)


def download(
    name: str,
    force: bool = False,
    progress: bool = True,
    retries: int = RETRIES,
    timeout: Optional[float] = None,
    speed_limit: Optional[float] = None,
    speed_time: Optional[float] = None,
) -> tuple[Path, Path]:
    """Download the published biLM `name` into the cache (see the module docstring) and return
    its options and weights files. Files already there are checked whole and verified against
    their record, not fetched again, unless `force`: then both are fetched, checked, and
    replace the files and their record. `timeout`: seconds a transfer may receive nothing;
    `speed_limit` (bytes a second, 0: none) and `speed_time` (seconds): the slowest transfer
    allowed, for how long (`util.download.Limits`: else the environment, else 60, 1024, 30)."""
    model = published_model(name)
    folder, base, command = model.folder(), base_url(), model.command
    limits = Limits.configured(timeout, speed_limit, speed_time)
    hint = (
        f"set {MIRROR_VARIABLE} to a mirror holding {model.shape}/ as published (https_proxy "
        f"for a proxy), or copy the published files into {folder}"
    )
    if not force:  # a malformed record stops the download before anything is fetched
        read_record(folder, command=command)
    check = functools.partial(_format_problem, model)
    for file_name in model.file_names:
        final, url = folder / file_name, model.url(file_name, base)
        if final.exists() and not force:  # a read-only cache is fine for this
            verify(final, check, command)
            continue
        try:
            probe_writable(final)
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise DownloadError(
                f"cannot write the spacy-elmo cache {folder} ({reason}); set {CACHE_VARIABLE} "
                "to a folder you can write"
            ) from None
        fetch(url, final, check, force, limits, progress, retries, command, hint)
    return (folder / model.options_name, folder / model.weights_name)


# ------------------------------------------------------------------------------ the checks
def _format_problem(model: PublishedModel, path: Path) -> Optional[str]:
    """What keeps a downloaded file from being `model`'s file (an error page, a cut or
    corrupted transfer, another architecture), if anything: the end of a sentence."""
    if path.name.removesuffix(PART_SUFFIX) == model.weights_name:
        return _weights_problem(model, path)
    from ..description.options import FIELDS, BiLMOptions

    try:
        options = BiLMOptions.from_file(path)
    except (ValueError, OSError) as error:
        return f"did not send a bilm-tf options file ({error})"
    expected = model.architecture
    differences = [
        f"{key} {getattr(options, name)!r} (published: {getattr(expected, name)!r})"
        for name, (key, _, _) in FIELDS.items()
        if getattr(options, name) != getattr(expected, name)
    ]
    if differences:
        return (
            f"is the options file of another biLM than the published '{model.name}': "
            f"{'; '.join(differences)}"
        )
    return None


def _weights_problem(model: PublishedModel, path: Path) -> Optional[str]:
    """Whether `path` is whole: an HDF5 file holding every dataset of `model`'s architecture
    (and no other), each of its shape and a weights dtype, readable and finite."""
    with path.open("rb") as handle:
        if handle.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
            return "did not send an HDF5 file (a proxy's or server's page?)"
    from .layouts import read_datasets

    try:
        for _ in read_datasets(path, model.architecture, f"the published '{model.name}'"):
            pass  # each dataset checked as it is read, then dropped
    except ValueError as error:  # cut or garbled: another architecture, a dtype, NaN or inf
        return f"is not a whole weights file of the published '{model.name}': {error}"
    return None
