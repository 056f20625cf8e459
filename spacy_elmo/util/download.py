"""One file fetched whole from a URL: resumed only when the server promises the same file,
bounded in time and in rate, checked, then installed under its final name atomically.

`fetch(url, final, check=...)` is the whole of it; `weights.published` names the files, the
cache and the checks, and calls it.

* Checked whole, recorded, atomic: a transfer must deliver the size the server announced
  (`Content-Length` or `Content-Range`); then `check(part)` (the caller's: a file format)
  runs on the whole part, and its size and sha256 are compared with the folder's record
  (`checksums.json`, trust on first use: the entry written at the file's first download)
  unless `replace`. Only then the part takes its final name (`os.replace`), so a file under
  the final name is always whole and checked, and a first download is recorded. A part that
  fails is deleted. `verify` checks a file already in place the same way.
* One writer: the part is locked (flock) while a download writes it; a second download of the
  same file stops with an error naming the part.

The transfer itself (resume, validators, time and rate bounds, the `file://` copy) is
`util.transfer`'s; its settings and errors are re-exported here for callers.

`check_destination` refuses a download whose destination folder is an input folder (a local
mirror), lies in one or holds one, compared by device and inode (`util.files.place`).
"""

from __future__ import annotations

import json
import os
import re
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from .files import file_sha256, fsync_directory, lock_file, place, write_text
from .transfer import (
    PART_SUFFIX,
    RETRIES,
    SPEED_LIMIT,
    SPEED_LIMIT_VARIABLE,
    SPEED_TIME,
    SPEED_TIME_VARIABLE,
    STATE_SUFFIX,
    TIMEOUT_SECONDS,
    TIMEOUT_VARIABLE,
    Advice,
    DownloadError,
    Limits,
    copy_local,
    handle_size,
    part_path,
    state_path,
    then,
    transfer_with_retries,
)

__all__ = [
    "PART_SUFFIX",
    "RECORD_NAME",
    "RETRIES",
    "SPEED_LIMIT",
    "SPEED_LIMIT_VARIABLE",
    "SPEED_TIME",
    "SPEED_TIME_VARIABLE",
    "STATE_SUFFIX",
    "TIMEOUT_SECONDS",
    "TIMEOUT_VARIABLE",
    "Advice",
    "ChecksumError",
    "DownloadError",
    "Limits",
    "check_destination",
    "fetch",
    "part_path",
    "read_record",
    "record_entry",
    "state_path",
    "verify",
    "write_record",
]

RECORD_NAME = "checksums.json"


class ChecksumError(DownloadError):
    """A file whose size or sha256 is not the one recorded at its first download."""


def fetch(
    url: str,
    final: Path,
    check: Optional[Callable[[Path], Optional[str]]] = None,
    replace: bool = False,
    limits: Optional[Limits] = None,
    progress: bool = True,
    retries: int = RETRIES,
    advice: Advice = Advice(),
) -> None:
    """`url` into `final` through its part (see the module docstring), all under a lock on the
    part: resumed, checked whole (`check(part)`: what is wrong with it, if anything), compared
    with the folder's record unless `replace`, renamed, then recorded. A file that another
    download installed meanwhile is verified (`verify`) instead, unless `replace`."""
    limits = limits or Limits.configured()
    part = part_path(final)
    try:
        handle = part.open("a+b")
    except OSError as error:
        raise DownloadError(
            f"cannot write {part} ({error.strerror}){then(advice.unwritable)}"
        ) from None
    with handle, _lock(part):
        try:
            if final.exists() and not replace:
                if handle_size(handle) == 0:
                    _discard(final)
                verify(final, check, advice)
                return
            if url.startswith("file:"):
                copy_local(url, handle, final, progress)
            else:
                transfer_with_retries(url, handle, final, limits, progress, retries, advice)
        except BaseException:
            if handle_size(handle) == 0:  # nothing arrived: leave no empty part
                _discard(final)
            raise
        handle.flush()
        os.fsync(handle.fileno())
        try:
            entry = _checked(url, part, final, check, replace, advice)
        except Exception:
            _discard(final)
            raise
        os.replace(part, final)  # `part` was synced whole before its check
        state_path(final).unlink(missing_ok=True)
        fsync_directory(final.parent)
        if entry is not None:
            write_record(final.parent, final.name, entry, replace=replace, advice=advice)


def verify(
    final: Path, check: Optional[Callable[[Path], Optional[str]]] = None, advice=Advice()
) -> None:
    """A file in place against its folder's record and `check`: ChecksumError when either
    finds it changed; a whole file without an entry (its first download was cut before the
    record was written) is recorded now."""
    entry = read_record(final.parent, advice=advice).get(final.name)
    size, digest = final.stat().st_size, file_sha256(final)
    again = f"{advice.force} to download it again"
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        raise ChecksumError(
            f"cached file {final} changed since it was downloaded: expected {entry['size']} "
            f"bytes, sha256 {entry['sha256']}; got {size} bytes, sha256 {digest}; {again}"
        )
    problem = check(final) if check else None
    if problem:
        raise ChecksumError(f"cached file {final} {problem}; {again}")
    if entry is None:
        entry = record_entry(size, digest, "found in the cache")
        write_record(final.parent, final.name, entry, replace=False, advice=advice)


def _checked(
    url: str,
    part: Path,
    final: Path,
    check: Optional[Callable[[Path], Optional[str]]],
    replace: bool,
    advice: Advice,
) -> Optional[dict[str, Any]]:
    """The whole `part` checked (`check`), then compared with the record unless `replace`:
    the entry to record once it is installed (None: the record has it already)."""
    problem = check(part) if check else None
    if problem:
        raise DownloadError(f"{url} {problem}; the download was deleted")
    size, digest = part.stat().st_size, file_sha256(part)
    entry = None if replace else read_record(final.parent, advice=advice).get(final.name)
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        raise ChecksumError(
            f"{url} is not the file recorded at its first download: expected "
            f"{entry['size']} bytes, sha256 {entry['sha256']}; got {size} bytes, sha256 "
            f"{digest}. The download was deleted. If the file really changed, "
            f"{advice.force} to check it and record it instead"
        )
    return record_entry(size, digest, url) if entry is None else None


def check_destination(
    destination: tuple[str, Path], sources: Iterable[tuple[str, Path]], fix: str = ""
) -> None:
    """DownloadError when the folder a download writes into is a folder it reads, lies inside
    one or holds one: compared by device and inode, so a symbolic link, a bind mount or
    another spelling of a folder is found. Each is (its description, its path); `fix` says
    what to do instead."""
    label, folder = destination
    folder = folder.expanduser()
    for source_label, source in sources:
        source = source.expanduser()
        try:
            source.stat()
        except OSError:  # a source that does not exist (or cannot be reached) holds nothing
            continue
        where = place(folder, source)
        if where is not None:
            relation = {"is": "is", "inside": "is inside", "contains": "holds"}[where]
            raise DownloadError(
                f"{label} {relation} {source_label}: a download would write into what it "
                f"reads{then(fix)}"
            )


# ------------------------------------------------------------------------------ the record
def read_record(folder: Path, replace: bool = False, advice: Advice = Advice()) -> dict[str, Any]:
    """The entries of `folder`'s record (`RECORD_NAME`: {"files": {name: {"size", "sha256",
    ...}}}) by file name; a record that is not one is a ChecksumError naming it (or, when
    `replace`, nothing: it is about to be rewritten)."""
    path = folder / RECORD_NAME
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError('expected a JSON object with a "files" object')
        for file_name, entry in record["files"].items():
            size = entry.get("size") if isinstance(entry, dict) else None
            digest = entry.get("sha256") if isinstance(entry, dict) else None
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"the entry of {file_name} has no size in bytes: {entry!r}")
            if not (isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest)):
                raise ValueError(f"the entry of {file_name} has no sha256 hex digest: {entry!r}")
    except (ValueError, OSError) as error:
        if replace:
            return {}
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ChecksumError(
            f"checksum record {path} is not readable ({reason}); {advice.force} to download "
            "the files and record them again, or delete it"
        ) from None
    return record["files"]


def write_record(
    folder: Path, file_name: str, entry: dict[str, Any], replace: bool, advice: Advice = Advice()
) -> None:
    """Add `file_name`'s entry to the record, atomically (`util.files.write_text`)."""
    files = read_record(folder, replace, advice)
    files[file_name] = entry
    write_text(folder / RECORD_NAME, json.dumps({"files": files}, indent=2, sort_keys=True) + "\n")


def record_entry(size: int, digest: str, source: str) -> dict[str, Any]:
    """A record's entry: the file's size, sha256, where it came from and when."""
    recorded = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"size": size, "sha256": digest, "source": source, "recorded": recorded}


# ------------------------------------------------------------------------------ small parts
def _discard(final: Path) -> None:
    part_path(final).unlink(missing_ok=True)
    state_path(final).unlink(missing_ok=True)


def _lock(part: Path) -> AbstractContextManager[Any]:
    """This download's lock on `part` (its contents left as they are), released when the
    block ends; a DownloadError when another download holds it."""
    try:
        return lock_file(part)
    except ImportError:  # not POSIX: no lock
        return nullcontext()
    except OSError:
        raise DownloadError(f"another download is writing {part}; wait for it to finish") from None
