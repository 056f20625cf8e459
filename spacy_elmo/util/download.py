"""One file fetched whole from an http(s) URL (`fetch`), thin over requests, filelock, srsly, tqdm.

A cut transfer resumes only while the server promises the same file (If-Range on a strong
validator); one that receives nothing, or crawls, ends with an error and keeps its part; the
whole file is checked against its folder's record (size, sha256) and renamed into place.
"""

from __future__ import annotations

import math
import os
import re
import stat
import time
from dataclasses import astuple, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable, Optional

import requests
import srsly
import urllib3
from tqdm import tqdm

from .files import file_sha256, fsync_directory, write_text

TIMEOUT_VARIABLE = "SPACY_ELMO_DOWNLOAD_TIMEOUT"
SPEED_LIMIT_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_LIMIT"
SPEED_TIME_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_TIME"
# Each of Limits' fields in order: its name in messages, its variable, what it must be.
SETTINGS = (
    ("timeout", TIMEOUT_VARIABLE, "a positive number of seconds"),
    ("--speed-limit", SPEED_LIMIT_VARIABLE, "a number of bytes a second >= 0 (0: no limit)"),
    ("--speed-time", SPEED_TIME_VARIABLE, "a positive number of seconds"),
)
RETRIES = 2  # further tries within one download after a cut transfer or a 429/5xx answer
RETRY_STATUSES = (429, 500, 502, 503, 504)
PART_SUFFIX = ".part"
RECORD_NAME = "checksums.json"
COMMAND = "spacy-elmo download"  # what a user runs to repeat a download, named in the errors
Check = Optional[Callable[[Path], Optional[str]]]  # what is wrong with a file, if anything


class DownloadError(OSError):
    """A download that did not complete: the server, the network, the destination or a check."""


class ChecksumError(DownloadError):
    """A file whose size or sha256 is not the one recorded at its first download."""


@dataclass(frozen=True)
class Limits:
    """A transfer ends after `timeout` s with nothing received, or below `speed_limit` bytes a
    second (0: no limit) over `speed_time` s."""

    timeout: float = 60.0
    speed_limit: float = 1024.0
    speed_time: float = 30.0

    @classmethod
    def configured(cls, timeout=None, speed_limit=None, speed_time=None) -> Limits:
        """The values given, else the environment's, else the defaults; a ValueError names a
        value that is not one and where it came from."""
        values = []
        given = (timeout, speed_limit, speed_time)
        for value, default, (name, variable, what) in zip(given, astuple(cls()), SETTINGS):
            where = f"{name} {value!r} ({variable})"
            if value is None:
                text = os.environ.get(variable, "").strip()
                where = f"{variable}={text!r}"
                try:
                    value = float(text) if text else default
                except ValueError:
                    value = math.nan
            if not 0 <= value < math.inf or (value == 0 and name != "--speed-limit"):
                raise ValueError(f"{where} is not {what}")
            values.append(float(value))
        return cls(*values)


def part_path(final: Path) -> Path:
    return final.with_name(final.name + PART_SUFFIX)


def state_path(final: Path) -> Path:
    return final.with_name(final.name + PART_SUFFIX + ".json")


def fetch(
    url: str,
    final: Path,
    check: Check = None,
    replace: bool = False,
    limits: Optional[Limits] = None,
    progress: bool = True,
    retries: int = RETRIES,
    command: str = COMMAND,
    hint: str = "check the URL, or set https_proxy for a proxy",
) -> None:
    """`url` into `final` under a lock, checked whole (`check`, the record unless `replace`).
    `command` repeats the download; `hint`: what to do when the server cannot deliver it."""
    # Imported here: filelock registers a fork hook when imported (tests/pipeline/
    # test_spacy_untouched.py holds that importing the package registers none).
    from filelock import FileLock, Timeout

    part = part_path(final)
    limits = limits or Limits.configured()
    retry = urllib3.Retry(
        retries, read=0, backoff_factor=0.5, status_forcelist=RETRY_STATUSES, raise_on_status=False
    )
    try:
        with FileLock(f"{final}.lock", blocking=False), requests.Session() as session:
            session.mount("http", requests.adapters.HTTPAdapter(max_retries=retry))
            session.headers.update({"User-Agent": "spacy-elmo", "Accept-Encoding": "identity"})
            try:
                with _open_part(final, url) as handle:
                    _transfer(session, url, handle, final, limits, progress, retries, command)
                    os.fsync(handle.fileno())
                verify(part, check, command, url, replace)
            except BaseException:
                if not state_path(final).exists() or not part.stat().st_size:
                    _discard(final)  # nothing to resume from
                raise
            os.replace(part, final)
            state_path(final).unlink(missing_ok=True)
            fsync_directory(final.parent)
    except Timeout:
        raise DownloadError(f"another download is writing {part}; wait for it to finish") from None
    except requests.HTTPError as error:
        status = f"HTTP {error.response.status_code} {error.response.reason}"
        raise DownloadError(f"cannot download {url}: {status}; {hint}") from None
    except requests.RequestException as error:
        reason = _reason(error)
        if isinstance(error, requests.Timeout):
            reason = f"no answer within {limits.timeout:g} s, {TIMEOUT_VARIABLE}"
        where = f"cannot reach {url} ({reason}); offline or behind a proxy?"
        raise DownloadError(f"{where} {hint}") from None


def _open_part(final: Path, url: str) -> BinaryIO:
    """The part there when its state names `url` and it is a file of one name (opened without
    following a link); else the name unlinked (never what it named) and a part created anew."""
    part = part_path(final)
    try:
        fd = os.open(part, os.O_RDWR | os.O_NOFOLLOW)
        info = os.fstat(fd)
        if _read_state(final, url) and stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return os.fdopen(fd, "r+b", buffering=0)  # unbuffered: the part grows with the bytes
        os.close(fd)
    except OSError:  # none there, or a link (ELOOP)
        pass
    _discard(final)
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    return os.fdopen(fd, "r+b", buffering=0)


def _transfer(session, url, handle, final, limits, progress, retries, command) -> None:
    """One answer into the part; a transfer cut after it got further is resumed at once
    (`retries` times), a stall or a crawl ends the download."""
    response = _answer(session, url, handle, final, limits)
    offset = handle.tell()
    length = response.headers.get("Content-Length", "")
    size = offset + int(length) if length.isdigit() else None
    received, ended, cut = offset, "", None
    window = (time.monotonic(), offset)  # when the rate's window starts, and the bytes then
    bar = tqdm(total=size, initial=offset, desc=final.name, disable=not progress, unit="B")
    with response, bar:
        while not ended:
            try:  # read1: what has arrived, so that the part grows and a crawl is measured
                block = response.raw.read1(1 << 20, decode_content=False)
            except urllib3.exceptions.ReadTimeoutError:
                ended = f"stalled: nothing arrived for {limits.timeout:g} s ({TIMEOUT_VARIABLE})"
                break
            except Exception as error:  # noqa: BLE001 - a reset, an early close
                cut = _reason(error)
                break
            if not block:
                break
            handle.write(block)
            bar.update(len(block))
            received += len(block)
            seconds = time.monotonic() - window[0]
            rate = (received - window[1]) / seconds if seconds >= limits.speed_time else math.inf
            if rate < limits.speed_limit:
                ended = (
                    f"is too slow: {rate:.1f} bytes/s over the last {seconds:.1f} s, below "
                    f"{limits.speed_limit:g} bytes/s ({SPEED_LIMIT_VARIABLE} or --speed-limit; 0 "
                    f"turns it off) for {limits.speed_time:g} s ({SPEED_TIME_VARIABLE} or "
                    "--speed-time),"
                )
            elif seconds >= limits.speed_time:
                window = (time.monotonic(), received)
    if not ended and cut is None and (size is None or received >= size):
        return
    if not ended and retries > 0 and received > offset:
        return _transfer(session, url, handle, final, limits, progress, retries - 1, command)
    where = f"{received} of {size or '?'} bytes"
    ended = f"{ended} after {where}" if ended else f"was cut at {where} ({cut or 'closed early'})"
    kept = state_path(final).exists() and part_path(final).stat().st_size
    keep = f" ({part_path(final)} keeps what arrived)" if kept else ""
    raise DownloadError(f"transfer of {url} {ended}; run `{command}` again to continue{keep}")


def _answer(session, url, handle, final, limits) -> requests.Response:
    """The rest of the file after the part while the server promises the same file (a 206 of
    its range), else all of it from byte 0, its strong validator (ETag, Last-Modified) kept."""
    offset = handle.seek(0, os.SEEK_END)
    saved = _read_state(final, url) if offset else None
    headers = {"Range": f"bytes={offset}-", "If-Range": saved["validator"]} if saved else {}
    response = session.get(url, headers=headers, stream=True, timeout=limits.timeout)
    if saved and response.status_code == 206:
        same = response.headers.get(saved["header"], saved["validator"]) == saved["validator"]
        stated = f"bytes {offset}-{saved['size'] - 1}/{saved['size']}"
        if same and response.headers.get("Content-Range", "").strip() == stated:
            return response
    handle.seek(0)
    handle.truncate()
    if headers and response.status_code != 200:  # another answer to the range: all of it
        response.close()
        response = session.get(url, stream=True, timeout=limits.timeout)
    response.raise_for_status()
    state_path(final).unlink(missing_ok=True)
    answer, length = response.headers, response.headers.get("Content-Length", "")
    header = "ETag" if answer.get("ETag", "").startswith('"') else "Last-Modified"  # not W/
    if header in answer and length.isdigit():
        state = {"url": url, "header": header, "validator": answer[header], "size": int(length)}
        write_text(state_path(final), srsly.json_dumps(state))
    return response


def _read_state(final: Path, url: str) -> Optional[dict]:
    """The part's state when it is of `url`; else None."""
    try:
        state = srsly.read_json(state_path(final))
        return state if state["url"] == url and state["header"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify(path: Path, check: Check = None, command=COMMAND, url="", replace=False) -> None:
    """A cached file (or the part of `url`'s download, deleted when wrong) checked by `check`
    and against its folder's record (unless `replace`); recorded when it has no entry there."""
    name = path.name.removesuffix(PART_SUFFIX) if url else path.name
    problem = check(path) if check else None
    if not stat.S_ISREG(path.lstat().st_mode):
        problem = "is not a regular file (a link?)"
    entry = None if replace else read_record(path.parent, command=command).get(name)
    size, digest = path.stat().st_size, file_sha256(path)
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        problem = f"changed since it was downloaded: expected {entry['size']} bytes, sha256 "
        problem += f"{entry['sha256']}; got {size} bytes, sha256 {digest}"
    force = f"run `{command} --force`"
    if problem and url:
        _discard(path.with_name(name))
        then = f"; {force} to check it and record it instead" if entry else ""
        error = ChecksumError if entry else DownloadError
        raise error(f"{url} {problem}; the download was deleted{then}")
    if problem:
        raise ChecksumError(f"cached file {path} {problem}; {force} to download it again")
    if entry is None:
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entry = {"size": size, "sha256": digest, "source": url or "found in the cache"}
        write_record(path.parent, name, {**entry, "recorded": now}, replace, command)


def read_record(folder: Path, replace: bool = False, command: str = COMMAND) -> dict:
    """The entries of `folder`'s record by file name; ChecksumError naming a record that is not
    one (nothing when `replace`: it is about to be rewritten)."""
    path = folder / RECORD_NAME
    try:
        files = srsly.read_json(path)["files"] if path.exists() else {}
        for name, entry in files.items():
            whole = isinstance(entry, dict) and type(entry.get("size")) is int
            if not whole or not re.fullmatch("[0-9a-f]{64}", str(entry.get("sha256"))):
                raise ValueError(f"the entry of {name} is {entry!r}")
    except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:
        if replace:
            return {}
        form = '{"files": {name: {"size": bytes, "sha256": hex digest}}}'
        again = f"run `{command} --force` to download and record the files again, or delete it"
        raise ChecksumError(f"checksum record {path} is not {form} ({error}); {again}") from None
    return files


def write_record(folder: Path, name: str, entry: dict, replace=False, command=COMMAND) -> None:
    """Add `name`'s entry to the folder's record (replaced whole, by rename)."""
    files = {**read_record(folder, replace, command), name: entry}
    write_text(folder / RECORD_NAME, srsly.json_dumps({"files": files}, indent=2, sort_keys=True))


def _discard(final: Path) -> None:
    part_path(final).unlink(missing_ok=True)
    state_path(final).unlink(missing_ok=True)


def _reason(error: BaseException) -> str:
    """A network error in a few words: the system's (Connection refused), else its own."""
    cause: Optional[BaseException] = error
    while cause is not None and not (isinstance(cause, OSError) and cause.strerror):
        cause = cause.__cause__ or cause.__context__
    return cause.strerror if cause else str(error).rpartition(": ")[2] or type(error).__name__
