"""The published AllenNLP/bilm-tf English biLMs by name: where they are, and their download.

`download(name)` fetches a model's two files (`<shape>/elmo_<shape>_options.json` and
`_weights.hdf5`, as AllenNLP publishes them) into the cache, `SPACY_ELMO_CACHE` (default
`$XDG_CACHE_HOME/spacy-elmo`, else `~/.cache/spacy-elmo`), in the same `<shape>/` layout.

* Resumable: a file arrives in `<file>.part`, written as the bytes arrive; a transfer that is
  cut keeps it, and the next download asks for the rest with an HTTP Range request (a server
  that ignores Range sends the whole file again, which then replaces the part).
* Bounded: a transfer that receives nothing for `SPACY_ELMO_DOWNLOAD_TIMEOUT` seconds (default
  60) ends with an error; the part is kept for the next download.
* Atomic: the file takes its final name only when whole and checked, so a file under the final
  name is always complete.
* Checked whole: a transfer must deliver the size the server announced (Content-Length or
  Content-Range); the options file must describe the name's published architecture, and the
  weights file must open as HDF5 and hold every dataset of that architecture, with its shape,
  a weights dtype and readable, finite values. Only then is the file recorded: AllenNLP
  publishes no checksums or sizes, so the size and sha256 of each file are recorded in
  `<shape>/checksums.json`, and every later download is verified against that record;
  `--force` downloads again and replaces the record with the new, checked copy.
* `SPACY_ELMO_MIRROR` replaces the published base URL: an http(s):// URL, a file:// URL or a
  local folder, holding the same `<shape>/` layout.

Nothing here is called unless the user asks for a download: `spacy-elmo download NAME` or a
config's `spacy_elmo.PublishedWeights.v1`. `sources.resolve_source` only reads the cache.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from http.client import HTTPException
from pathlib import Path
from typing import Any, BinaryIO, Optional

from ..util.files import file_sha256, fsync_directory, lock_file, write_text

PUBLISHED_BASE_URL = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
CACHE_VARIABLE = "SPACY_ELMO_CACHE"
MIRROR_VARIABLE = "SPACY_ELMO_MIRROR"
TIMEOUT_VARIABLE = "SPACY_ELMO_DOWNLOAD_TIMEOUT"
RECORD_NAME = "checksums.json"
PART_SUFFIX = ".part"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
BLOCK_BYTES = 1 << 20
# Seconds a transfer may receive nothing (connecting, waiting for the answer, or between two
# reads) before it ends with an error: SPACY_ELMO_DOWNLOAD_TIMEOUT overrides it.
TIMEOUT_SECONDS = 60.0
# Further attempts within one download after a transfer is cut (each resumes with Range).
RETRIES = 2


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
    def options(self) -> dict[str, Any]:
        """The published options.json of this model, as a dictionary."""
        return {
            "lstm": {
                "use_skip_connections": True,
                "projection_dim": self.projection_dim,
                "cell_clip": 3,
                "proj_clip": 3,
                "dim": self.lstm_dim,
                "n_layers": 2,
            },
            "char_cnn": {
                "activation": "relu",
                "filters": [list(pair) for pair in PUBLISHED_FILTERS],
                "n_highway": self.n_highway,
                "embedding": {"dim": 16},
                "n_characters": 262,
                "max_characters_per_token": 50,
            },
        }

    @property
    def architecture(self) -> Any:
        """The `BiLMOptions` every copy of this model must match."""
        from ..bilm.options import BiLMOptions

        return BiLMOptions.from_dict(self.options, source=f"the published biLM '{self.name}'")

    def url(self, file_name: str, base: Optional[str] = None) -> str:
        return f"{(base or base_url()).rstrip('/')}/{self.shape}/{file_name}"

    def folder(self, cache: Optional[Path] = None) -> Path:
        """Where the cache keeps this model's files."""
        return (cache or cache_dir()) / self.shape


PUBLISHED = {
    model.name: model
    for model in (
        PublishedModel("small", "2x1024_128_2048cnn_1xhighway", 1024, 128, 1),
        PublishedModel("medium", "2x2048_256_2048cnn_1xhighway", 2048, 256, 1),
        PublishedModel("original", "2x4096_512_2048cnn_2xhighway", 4096, 512, 2),
        PublishedModel("original-5.5b", "2x4096_512_2048cnn_2xhighway_5.5B", 4096, 512, 2),
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
    """The base URL the files are fetched from: `SPACY_ELMO_MIRROR` (an http(s):// or file://
    URL, or a local folder, which becomes a file:// URL), else AllenNLP's. A mirror that is
    none of these, or a local one that is not a folder, is a DownloadError naming it."""
    mirror = os.environ.get(MIRROR_VARIABLE, "").strip()
    if not mirror:
        return PUBLISHED_BASE_URL
    scheme = urllib.parse.urlsplit(mirror).scheme.lower() if "://" in mirror else ""
    if scheme in ("http", "https"):
        return mirror
    if scheme and scheme != "file":
        raise DownloadError(
            f"{MIRROR_VARIABLE}={mirror!r} is not an http://, https:// or file:// URL nor a "
            "local folder"
        )
    parsed = urllib.parse.urlsplit(mirror)
    if scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise DownloadError(
            f"{MIRROR_VARIABLE}={mirror!r} names a file:// URL on host '{parsed.netloc}'; a "
            "file:// mirror is a folder of this machine (file:///path/to/mirror)"
        )
    folder = Path(urllib.request.url2pathname(parsed.path)) if scheme else Path(mirror).expanduser()
    if not folder.is_dir():
        state = "does not exist" if not folder.exists() else "is not a folder"
        raise DownloadError(
            f"{MIRROR_VARIABLE}={mirror!r}: the mirror folder {folder} {state}; a mirror "
            "holds the published <shape>/ folders"
        )
    return folder.resolve().as_uri()


def download_timeout() -> float:
    """Seconds a transfer may receive nothing: `SPACY_ELMO_DOWNLOAD_TIMEOUT`, else 60."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return TIMEOUT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is not a positive number of seconds")
    return value


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
    timeout: Optional[float] = None,
) -> tuple[Path, Path]:
    """Download the published biLM `name` into the cache (see the module docstring) and return
    its options and weights files. Files already there are checked whole and verified against
    their record, not fetched again, unless `force`: then both are fetched, checked, and
    replace the files and their record. `timeout`: seconds a transfer may receive nothing
    (default `SPACY_ELMO_DOWNLOAD_TIMEOUT`, else 60)."""
    model = published_model(name)
    folder = model.folder()
    base = base_url()
    timeout = download_timeout() if timeout is None else timeout
    if not force:
        _read_record(folder)  # a malformed record stops the download before anything is fetched
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


def _read_record(folder: Path, replace: bool = False) -> dict[str, Any]:
    """The record's entries by file name; a record that is not one is a ChecksumError naming
    it (or, when `replace`, which `--force` does, nothing: it is about to be rewritten)."""
    path = folder / RECORD_NAME
    if not path.exists():
        return {}
    try:
        files = _record_entries(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, OSError) as error:
        if replace:
            return {}
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ChecksumError(
            f"checksum record {path} is not readable ({reason}); run `spacy-elmo download "
            "NAME --force` to download the files and record them again, or delete it"
        ) from None
    return files


def _record_entries(record: Any) -> dict[str, Any]:
    """The "files" of a parsed record, every entry checked; ValueError saying what is wrong."""
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise ValueError('expected a JSON object with a "files" object')
    for file_name, entry in record["files"].items():
        size = entry.get("size") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"the entry of {file_name} has no size in bytes: {entry!r}")
        if not (
            isinstance(digest, str)
            and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest)
        ):
            raise ValueError(f"the entry of {file_name} has no sha256 hex digest: {entry!r}")
    return record["files"]


def _write_record(folder: Path, file_name: str, entry: dict[str, Any], replace: bool) -> None:
    """Add `file_name`'s entry to the record, atomically (`util.files.write_text`)."""
    files = _read_record(folder, replace=replace)
    files[file_name] = entry
    text = json.dumps({"files": files}, indent=2, sort_keys=True) + "\n"
    write_text(folder / RECORD_NAME, text)


def _verify_cached(model: PublishedModel, path: Path) -> None:
    """A cached file against its record and checked whole; a whole file without a record
    (its first download was cut before the record was written) is recorded now."""
    entry = _read_record(path.parent).get(path.name)
    size, digest = path.stat().st_size, file_sha256(path)
    again = f"run `spacy-elmo download {model.name} --force` to download it again"
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        raise ChecksumError(
            f"cached file {path} changed since it was downloaded: expected {entry['size']} "
            f"bytes, sha256 {entry['sha256']}; got {size} bytes, sha256 {digest}; {again}"
        )
    problem = _format_problem(model, path)
    if problem:
        raise ChecksumError(f"cached file {path} {problem}; {again}")
    if entry is None:
        _write_record(path.parent, path.name, _entry(size, digest, "found in the cache"), False)


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
    with handle, _lock(part):
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
        _check_and_install(model, url, part, final, force)


def _transfer_with_retries(
    model: PublishedModel,
    url: str,
    handle: BinaryIO,
    part: Path,
    progress: bool,
    retries: int,
    timeout: float,
) -> None:
    """`_transfer`, again from where a cut transfer stopped, while each try gets further; a
    transfer that received nothing for `timeout` seconds is not tried again."""
    attempt = 0
    while True:
        before = handle.seek(0, os.SEEK_END)
        try:
            _transfer(model, url, handle, part, progress, timeout)
            return
        except _Cut as cut:
            received = handle.seek(0, os.SEEK_END)
            keep = f"({part} keeps what arrived)" if received else ""
            if cut.stalled:
                raise DownloadError(
                    f"transfer of {url} stalled: nothing arrived for {timeout:g} s "
                    f"({TIMEOUT_VARIABLE}) after {received} of {cut.size or '?'} bytes; run "
                    f"`spacy-elmo download {model.name}` again to continue from there {keep}"
                ) from None
            if attempt >= retries or received <= before:
                raise DownloadError(
                    f"transfer of {url} was cut at {received} of {cut.size or '?'} bytes "
                    f"({cut.reason}); run `spacy-elmo download {model.name}` again to "
                    f"continue from there {keep}"
                ) from None
            attempt += 1


@dataclass(frozen=True)
class _Unsatisfiable:
    """A 416 answer to a Range request: the file's size as the server states it."""

    size: Optional[int]


class _Cut(Exception):
    def __init__(self, reason: str, size: Optional[int], stalled: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.size, self.stalled = reason, size, stalled


def _lock(part: Path) -> AbstractContextManager[Any]:
    """This download's lock on `part` (its contents left as they are), released when the
    block ends; a DownloadError when another download holds it."""
    try:
        return lock_file(part)
    except ImportError:  # not POSIX: no lock
        return nullcontext()
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
            # read1: what has arrived (up to a block), so the part and the bar grow with it
            read = getattr(response, "read1", response.read)
            while True:
                try:
                    block = read(BLOCK_BYTES)
                except (OSError, HTTPException) as error:  # reset, timeout, incomplete read
                    raise _Cut(_reason(error), size, isinstance(error, socket.timeout)) from None
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
        handle.flush()
    except OSError as error:
        raise DownloadError(f"cannot write {part} ({error.strerror})") from None


def _open(model: PublishedModel, url: str, offset: int, timeout: float) -> Any:
    """The response to a GET of `url` from byte `offset` (a 416 to it: `_Unsatisfiable`)."""
    if url.startswith("file:"):
        local = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
        if not local.is_file():
            raise DownloadError(
                f"the mirror folder {local.parent.parent} ({MIRROR_VARIABLE}) has no "
                f"{model.shape}/{local.name}; a mirror holds the published <shape>/ folders"
            )
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
        if reason == "timed out":
            reason = f"no answer within {timeout:g} s, {TIMEOUT_VARIABLE}"
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


def _check_and_install(
    model: PublishedModel, url: str, part: Path, final: Path, force: bool
) -> None:
    """Check the whole `part` (its format and architecture, then the record unless `force`),
    give it its final name, and record it (`force`: in place of the record's entry)."""
    problem = _format_problem(model, part)
    if problem:
        part.unlink()
        raise DownloadError(f"{url} {problem}; the download was deleted")
    size, digest = part.stat().st_size, file_sha256(part)
    entry = None if force else _read_record(final.parent).get(final.name)
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        part.unlink()
        raise ChecksumError(
            f"{url} is not the file recorded at its first download: expected "
            f"{entry['size']} bytes, sha256 {entry['sha256']}; got {size} bytes, sha256 "
            f"{digest}. The download was deleted. If the published file really changed, run "
            f"`spacy-elmo download {model.name} --force` to check it and record it instead"
        )
    os.replace(part, final)  # `part` was synced whole before its check
    fsync_directory(final.parent)
    if entry is None:
        _write_record(final.parent, final.name, _entry(size, digest, url), replace=force)


def _format_problem(model: PublishedModel, path: Path) -> Optional[str]:
    """What keeps a downloaded file from being `model`'s file (an error page, a cut or
    corrupted transfer, another architecture), if anything: the end of a sentence."""
    if path.name.endswith(PART_SUFFIX):
        file_name = path.name[: -len(PART_SUFFIX)]
    else:
        file_name = path.name
    if file_name == model.weights_name:
        return _weights_problem(model, path)
    from ..bilm.options import BiLMOptions

    try:
        options = BiLMOptions.from_file(path)
    except (ValueError, OSError) as error:
        return f"did not send a bilm-tf options file ({error})"
    expected = model.architecture
    if options != expected:
        found, wanted = options.to_dict(), expected.to_dict()
        differences = [
            f"{section}.{key} {found[section].get(key)!r} (published: {value!r})"
            for section in ("char_cnn", "lstm")
            for key, value in wanted[section].items()
            if found[section].get(key) != value
        ]
        return (
            f"is the options file of another biLM than the published '{model.name}': "
            f"{'; '.join(differences) or 'its options differ'}"
        )
    return None


def _weights_problem(model: PublishedModel, path: Path) -> Optional[str]:
    """Whether `path` is whole: an HDF5 file holding every dataset of `model`'s architecture
    (and no other), each of its shape and a weights dtype, readable and finite."""
    with path.open("rb") as handle:
        if handle.read(len(HDF5_SIGNATURE)) != HDF5_SIGNATURE:
            return "did not send an HDF5 file (a proxy's or server's page?)"
    import h5py

    from .layouts import check_weights, expected_datasets

    expected = expected_datasets(model.architecture)
    whole = f"is not a whole weights file of the published '{model.name}'"
    try:
        # locking=False: the download holds its own lock (flock) on the part being checked
        with h5py.File(path, "r", locking=False) as hdf5:
            found: dict[str, Any] = {}
            hdf5.visititems(
                lambda name, obj: (
                    found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None
                )
            )
            missing = [name for name in expected if name not in found]
            if missing:
                return f"{whole}: it has no dataset {', '.join(missing[:3])}"
            unexpected = sorted(set(found) - set(expected))
            if unexpected:
                return f"{whole}: it has datasets {', '.join(unexpected[:3])} that it has not"
            for name, shape in expected.items():
                dataset = found[name]
                if tuple(dataset.shape) != shape:
                    return f"{whole}: dataset {name} has shape {tuple(dataset.shape)}, not {shape}"
                check_weights({name: dataset[...]}, f"dataset {name}", "dataset")
    except ValueError as error:  # a dtype that is not weights, NaN or inf
        return f"{whole}: {error}"
    except (OSError, KeyError, RuntimeError, TypeError) as error:  # cut, corrupted
        reason = " ".join(str(error).split()) or type(error).__name__
        return f"{whole}: it cannot be read as HDF5 ({reason}); the transfer was cut or garbled"
    return None
