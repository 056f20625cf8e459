"""The published AllenNLP/bilm-tf English biLMs by name: where they are, and their download.

`download(name)` fetches a model's two files (`<shape>/elmo_<shape>_options.json` and
`_weights.hdf5`, as AllenNLP publishes them) into the cache, `SPACY_ELMO_CACHE` (default
`$XDG_CACHE_HOME/spacy-elmo`, else `~/.cache/spacy-elmo`), in the same `<shape>/` layout.

* Resumable: a file arrives in `<file>.part`; a transfer that is cut keeps it, and the next
  download asks for the rest with an HTTP Range request (a server that ignores Range sends the
  whole file again, which then replaces the part).
* Atomic: the file takes its final name only when whole and checked, so a file under the final
  name is always complete.
* Checked: a transfer must deliver the size the server announced (Content-Length or
  Content-Range); the options file must be JSON and the weights an HDF5 file. AllenNLP
  publishes no checksums or sizes, so the size and sha256 of each file are recorded in
  `<shape>/checksums.json` at its first download, and every later download or `--force` copy
  is verified against that record (a mismatching copy is deleted, not kept).
* `SPACY_ELMO_MIRROR` replaces the published base URL (a mirror holds the same layout).

Nothing here is called unless the user asks for a download: `spacy-elmo download NAME` or a
config's `spacy_elmo.PublishedWeights.v1`. `sources.resolve_source` only reads the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from http.client import HTTPException
from pathlib import Path
from typing import Any, BinaryIO, Optional

PUBLISHED_BASE_URL = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
CACHE_VARIABLE = "SPACY_ELMO_CACHE"
MIRROR_VARIABLE = "SPACY_ELMO_MIRROR"
RECORD_NAME = "checksums.json"
PART_SUFFIX = ".part"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
BLOCK_BYTES = 1 << 20
TIMEOUT_SECONDS = 60.0
# Further attempts within one download after a transfer is cut (each resumes with Range).
RETRIES = 2


@dataclass(frozen=True)
class PublishedModel:
    """A published biLM: its name here and its shape, the folder AllenNLP publishes it in."""

    name: str
    shape: str

    @property
    def options_name(self) -> str:
        return f"elmo_{self.shape}_options.json"

    @property
    def weights_name(self) -> str:
        return f"elmo_{self.shape}_weights.hdf5"

    @property
    def file_names(self) -> tuple[str, str]:
        return (self.options_name, self.weights_name)

    def url(self, file_name: str, base: Optional[str] = None) -> str:
        return f"{(base or base_url()).rstrip('/')}/{self.shape}/{file_name}"

    def folder(self, cache: Optional[Path] = None) -> Path:
        """Where the cache keeps this model's files."""
        return (cache or cache_dir()) / self.shape


PUBLISHED = {
    model.name: model
    for model in (
        PublishedModel("small", "2x1024_128_2048cnn_1xhighway"),
        PublishedModel("medium", "2x2048_256_2048cnn_1xhighway"),
        PublishedModel("original", "2x4096_512_2048cnn_2xhighway"),
        PublishedModel("original-5.5b", "2x4096_512_2048cnn_2xhighway_5.5B"),
    )
}


class DownloadError(OSError):
    """A download that did not complete: the server, the network, the cache or a check."""


class ChecksumError(DownloadError):
    """A file whose size or sha256 is not the one recorded at its first download."""


def published_model(name: str) -> PublishedModel:
    """The published model called `name`; ValueError naming the choices otherwise."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown published biLM '{name}'; choose one of {', '.join(PUBLISHED)}")
    return PUBLISHED[name]


def base_url() -> str:
    """The base URL the files are fetched from: `SPACY_ELMO_MIRROR`, else AllenNLP's."""
    return os.environ.get(MIRROR_VARIABLE, "").strip() or PUBLISHED_BASE_URL


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
    record = _read_record(folder)
    for path in paths:
        expected = record.get(path.name, {}).get("size")
        if expected is not None and path.stat().st_size != expected:
            raise ChecksumError(
                f"cached file {path} is {path.stat().st_size} bytes, {expected} when it was "
                f"downloaded; run `spacy-elmo download {name} --force` to download it again"
            )
    return paths  # type: ignore[return-value]


def ensure(name: str, progress: bool = True) -> tuple[Path, Path]:
    """The cached files of `name`, downloaded first when they are not in the cache."""
    return cached_files(name) or download(name, progress=progress)


def download(
    name: str,
    force: bool = False,
    progress: bool = True,
    retries: int = RETRIES,
    timeout: float = TIMEOUT_SECONDS,
) -> tuple[Path, Path]:
    """Download the published biLM `name` into the cache (see the module docstring) and return
    its options and weights files. Files already there are verified against the record of
    their first download, not fetched again, unless `force`."""
    model = published_model(name)
    folder = model.folder()
    base = base_url()
    for file_name in model.file_names:
        final = folder / file_name
        if final.exists() and not force:  # a read-only cache is fine for this
            _verify_cached(model, final)
            continue
        _writable_folder(folder)
        _fetch(model, model.url(file_name, base), final, force, progress, retries, timeout)
    return (folder / model.options_name, folder / model.weights_name)


# ------------------------------------------------------------------------------ the cache
def _writable_folder(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise DownloadError(
            f"cannot write the spacy-elmo cache {folder} ({reason}); set {CACHE_VARIABLE} to "
            "a folder you can write"
        ) from None
    return folder


def _read_record(folder: Path) -> dict[str, Any]:
    path = folder / RECORD_NAME
    if not path.is_file():
        return {}
    try:
        files = json.loads(path.read_text(encoding="utf-8")).get("files", {})
    except (ValueError, AttributeError) as error:
        raise ChecksumError(
            f"checksum record {path} is not readable ({error}); delete it to record the "
            "files' checksums again"
        ) from None
    return files if isinstance(files, dict) else {}


def _write_record(folder: Path, file_name: str, entry: dict[str, Any]) -> None:
    """Add `file_name`'s entry to the record, atomically (a temporary file renamed)."""
    files = _read_record(folder)
    files[file_name] = entry
    path = folder / RECORD_NAME
    tmp = folder / f".{RECORD_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"files": files}, indent=2, sort_keys=True) + "\n", "utf-8")
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify_cached(model: PublishedModel, path: Path) -> None:
    """A cached file against its record; a file without one (its first download was cut
    before the record was written) is recorded now."""
    entry = _read_record(path.parent).get(path.name)
    size, digest = path.stat().st_size, _sha256(path)
    if entry is None:
        _write_record(path.parent, path.name, _entry(size, digest, "found in the cache"))
        return
    if (size, digest) != (entry.get("size"), entry.get("sha256")):
        raise ChecksumError(
            f"cached file {path} changed since it was downloaded: expected {entry.get('size')} "
            f"bytes, sha256 {entry.get('sha256')}; got {size} bytes, sha256 {digest}; run "
            f"`spacy-elmo download {model.name} --force` to download it again"
        )


def _entry(size: int, digest: str, source: str) -> dict[str, Any]:
    recorded = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"size": size, "sha256": digest, "source": source, "recorded": recorded}


# ------------------------------------------------------------------------------ the transfer
def _fetch(
    model: PublishedModel,
    url: str,
    final: Path,
    force: bool,
    progress: bool,
    retries: int,
    timeout: float,
) -> None:
    """`url` into `final` through `final.part`: resumed, checked, then renamed, all under a
    lock on the part (another download of the same file waits for none of it: it stops)."""
    part = final.with_name(final.name + PART_SUFFIX)
    try:
        handle = part.open("a+b")
    except OSError as error:
        raise DownloadError(
            f"cannot write {part} ({error.strerror}); set {CACHE_VARIABLE} to a folder you "
            "can write"
        ) from None
    with handle:
        _lock(handle, part)
        try:
            if final.exists() and not force:  # another download finished it meanwhile
                if handle.seek(0, os.SEEK_END) == 0:
                    part.unlink(missing_ok=True)
                _verify_cached(model, final)
                return
            _transfer_with_retries(model, url, handle, part, progress, retries, timeout)
        except BaseException:
            if handle.seek(0, os.SEEK_END) == 0:  # nothing arrived: leave no empty part
                part.unlink(missing_ok=True)
            raise
        handle.flush()
        os.fsync(handle.fileno())
        _check_and_install(model, url, part, final)


def _transfer_with_retries(
    model: PublishedModel,
    url: str,
    handle: BinaryIO,
    part: Path,
    progress: bool,
    retries: int,
    timeout: float,
) -> None:
    """`_transfer`, again from where a cut transfer stopped, while each try gets further."""
    attempt = 0
    while True:
        before = handle.seek(0, os.SEEK_END)
        try:
            _transfer(model, url, handle, part, progress, timeout)
            return
        except _Cut as cut:
            received = handle.seek(0, os.SEEK_END)
            if attempt >= retries or received <= before:
                raise DownloadError(
                    f"transfer of {url} was cut at {received} of {cut.size or '?'} bytes "
                    f"({cut.reason}); run `spacy-elmo download {model.name}` again to "
                    f"continue from there ({part} keeps what arrived)"
                ) from None
            attempt += 1


@dataclass(frozen=True)
class _Unsatisfiable:
    """A 416 answer to a Range request: the file's size as the server states it."""

    size: Optional[int]


class _Cut(Exception):
    def __init__(self, reason: str, size: Optional[int]) -> None:
        super().__init__(reason)
        self.reason, self.size = reason, size


def _lock(handle: BinaryIO, part: Path) -> None:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise DownloadError(f"another download is writing {part}; wait for it to finish") from None


def _transfer(
    model: PublishedModel,
    url: str,
    handle: BinaryIO,
    part: Path,
    progress: bool,
    timeout: float,
) -> None:
    """One request: the rest of the file after what `handle` holds (or all of it)."""
    offset = handle.seek(0, os.SEEK_END)
    response = _open(model, url, offset, timeout)
    if isinstance(response, _Unsatisfiable):  # 416 to a request from byte `offset`
        if response.size == offset:  # the part is whole (its check or rename was cut)
            return
        handle.truncate(0)  # the part is longer than the file: start again
        offset = 0
        response = _open(model, url, 0, timeout)
    with response:
        if offset and response.status != 206:  # the server ignored Range: the whole file
            handle.truncate(0)
            offset = 0
        size = _announced_size(response, url, offset)
        received = offset
        from tqdm import tqdm

        with tqdm(
            total=size,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=part.name[: -len(PART_SUFFIX)],
            disable=not progress,
            file=sys.stderr,
            leave=False,
        ) as bar:
            while True:
                try:
                    block = response.read(BLOCK_BYTES)
                except (OSError, HTTPException) as error:  # reset, timeout, incomplete read
                    raise _Cut(_reason(error), size) from None
                if not block:
                    break
                _write(handle, block, part)
                received += len(block)
                bar.update(len(block))
    if size is not None and received < size:
        raise _Cut("the connection closed early", size)
    if size is not None and received > size:
        handle.truncate(0)
        raise DownloadError(f"{url} sent {received} bytes, more than the {size} it announced")


def _write(handle: BinaryIO, block: bytes, part: Path) -> None:
    try:
        handle.write(block)
    except OSError as error:
        raise DownloadError(f"cannot write {part} ({error.strerror})") from None


def _open(model: PublishedModel, url: str, offset: int, timeout: float) -> Any:
    """The response to a GET of `url` from byte `offset` (a 416 to it: `_Unsatisfiable`)."""
    headers = {"User-Agent": "spacy-elmo", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        error.close()
        if error.code == 416 and offset:
            total = error.headers.get("Content-Range", "").rpartition("/")[2]
            return _Unsatisfiable(int(total) if total.isdigit() else None)
        hint = (
            f"does the mirror ({MIRROR_VARIABLE}) hold {model.shape}/ as published?"
            if os.environ.get(MIRROR_VARIABLE, "").strip()
            else f"set {MIRROR_VARIABLE} to a mirror that holds it"
        )
        raise DownloadError(
            f"cannot download {url}: HTTP {error.code} {error.reason}; {hint}"
        ) from None
    except (urllib.error.URLError, OSError, HTTPException) as error:
        reason = _reason(getattr(error, "reason", error))
        raise DownloadError(
            f"cannot reach {url} ({reason}); offline or behind a proxy? set {MIRROR_VARIABLE} "
            f"to a mirror holding {model.shape}/{Path(url).name} (or https_proxy for a proxy), "
            f"or copy the published files into {model.folder()}"
        ) from None


def _reason(error: object) -> str:
    if isinstance(error, socket.timeout):
        return "timed out"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _announced_size(response: Any, url: str, offset: int) -> Optional[int]:
    """The whole file's size as the response states it (Content-Range, else Content-Length)."""
    if response.status == 206:
        content_range = response.headers.get("Content-Range", "")
        unit, _, rest = content_range.partition(" ")
        span, _, total = rest.partition("/")
        start = span.partition("-")[0]
        if unit != "bytes" or not start.isdigit() or int(start) != offset:
            raise DownloadError(
                f"{url} answered a request from byte {offset} with Content-Range '{content_range}'"
            )
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def _check_and_install(model: PublishedModel, url: str, part: Path, final: Path) -> None:
    """Check the whole `part` (its format and the record) and give it its final name."""
    problem = _format_problem(part, final.name)
    if problem:
        part.unlink()
        raise DownloadError(f"{url} {problem}; the download was deleted")
    size, digest = part.stat().st_size, _sha256(part)
    entry = _read_record(final.parent).get(final.name)
    if entry is not None and (size, digest) != (entry.get("size"), entry.get("sha256")):
        part.unlink()
        raise ChecksumError(
            f"{url} is not the file recorded at its first download: expected "
            f"{entry.get('size')} bytes, sha256 {entry.get('sha256')}; got {size} bytes, "
            f"sha256 {digest}. The download was deleted. If the published file really "
            f"changed, delete {final.parent / RECORD_NAME} and download again"
        )
    os.replace(part, final)
    _fsync_folder(final.parent)
    if entry is None:
        _write_record(final.parent, final.name, _entry(size, digest, url))


def _format_problem(path: Path, file_name: str) -> Optional[str]:
    """What is wrong with a downloaded file's format (an error page saved instead), if any."""
    if file_name.endswith(".hdf5"):
        with path.open("rb") as handle:
            if handle.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
                return "did not send an HDF5 file (a proxy's or server's page?)"
        return None
    from .options import BiLMOptions

    try:
        BiLMOptions.from_file(path)
    except (ValueError, OSError) as error:
        return f"did not send a bilm-tf options file ({error})"
    return None


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported on this platform
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
