"""One file fetched whole from a URL (`fetch`), thin over requests, filelock, srsly and tqdm.

A cut transfer resumes only while the server promises the same file (If-Range on a strong
validator); one that receives nothing, or crawls, ends with an error and keeps its part; the
whole file is checked against its folder's record (size, sha256) and renamed into place.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
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
RETRIES = 2  # further tries within one download after a transfer is cut, each resumed
RETRY_STATUSES = (429, 500, 502, 503, 504)  # answers that urllib3 asks again for
PROGRESS = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "leave": False}  # tqdm's
PART_SUFFIX = ".part"
RECORD_NAME = "checksums.json"
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
        for field, value, (name, variable, what) in zip(fields(cls), given, SETTINGS):
            where = f"{name} {value!r} ({variable})"
            if value is None:
                text = os.environ.get(variable, "").strip() or str(field.default)
                where = f"{variable}={text!r}"
                value = float(text) if re.fullmatch(r"\d+(\.\d*)?|\.\d+", text) else -1.0
            above_0 = value >= 0 if field.name == "speed_limit" else value > 0
            if not (above_0 and value < float("inf")):
                raise ValueError(f"{where} is not {what}")
            values.append(float(value))
        return cls(*values)


@dataclass(frozen=True)
class Advice:
    """What a download's errors tell the user to do."""

    again: str = "fetch it again to continue from there"
    force: str = "fetch it with replace=True"
    unreachable: str = "offline, or behind a proxy (https_proxy)?"
    http_error: str = "is the URL right?"
    unwritable: str = "choose a folder you can write"


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
    advice: Advice = Advice(),
) -> None:
    """`url` into `final` under a lock: a file in place is verified instead, unless `replace`."""
    # Imported here: filelock registers a fork hook when imported (tests/pipeline/
    # test_spacy_untouched.py holds that importing the package registers none).
    from filelock import FileLock, Timeout

    part = part_path(final)
    limits = limits or Limits.configured()
    try:
        with FileLock(f"{final}.lock", blocking=False):
            if final.exists() and not replace:
                _discard(final)
                return verify(final, check, advice)
            try:
                with _open_part(final, url) as handle:
                    _download(url, handle, final, limits, progress, retries, advice)
                    os.fsync(handle.fileno())
                entry = _examine(part, final.name, check, advice, url, replace)
            except BaseException:
                if not state_path(final).exists() or not part.stat().st_size:
                    _discard(final)  # nothing to resume from
                raise
            os.replace(part, final)
            state_path(final).unlink(missing_ok=True)
            fsync_directory(final.parent)
            if entry is not None:
                write_record(final.parent, final.name, entry, replace, advice)
    except Timeout:
        raise DownloadError(f"another download is writing {part}; wait for it to finish") from None
    except DownloadError:
        raise
    except OSError as error:
        what = f"read {error.filename}" if url.startswith("file:") else f"write {part}"
        hint = f"; {advice.unwritable}" if "write" in what else ""
        raise DownloadError(f"cannot {what} ({error.strerror or error}){hint}") from None


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


def _download(url, handle, final, limits, progress, retries, advice) -> None:
    """`url` into the part: a copy of a file:// URL, else an HTTP transfer, where urllib3 asks
    again after a refused connection or a 429/5xx answer."""
    if url.startswith("file:"):
        with open(urllib.request.url2pathname(urllib.parse.urlsplit(url).path), "rb") as source:
            return shutil.copyfileobj(source, handle)
    retry = urllib3.Retry(
        retries, read=0, backoff_factor=0.5, status_forcelist=RETRY_STATUSES, raise_on_status=False
    )
    with requests.Session() as session:
        session.mount("http", requests.adapters.HTTPAdapter(max_retries=retry))
        session.headers.update({"User-Agent": "spacy-elmo", "Accept-Encoding": "identity"})
        _transfer(session, url, handle, final, limits, progress, retries, advice)


def _transfer(session, url, handle, final, limits, progress, retries, advice) -> None:
    """One answer into the part; a transfer cut after it got further is resumed at once
    (`retries` times), a stall or a crawl ends the download."""
    response = _answer(session, url, handle, final, limits, advice)
    if response is None:
        return  # the part is whole already
    offset = handle.tell()
    length = response.headers.get("Content-Length", "")
    size = offset + int(length) if length.isdigit() else None
    total = size or "?"
    received, cut = offset, None
    window = (time.monotonic(), offset)  # when the rate's window starts, and the bytes then
    bar = tqdm(total=size, initial=offset, desc=final.name, disable=not progress, **PROGRESS)
    with response, bar:
        while True:
            try:  # read1: what has arrived, so that the part grows and a crawl is measured
                block = response.raw.read1(1 << 20, decode_content=False)
            except urllib3.exceptions.ReadTimeoutError:
                stalled = f"nothing arrived for {limits.timeout:g} s ({TIMEOUT_VARIABLE})"
                where = f"{received} of {total} bytes"
                raise _ended(url, f"stalled: {stalled} after {where}", final, advice) from None
            except Exception as error:  # noqa: BLE001 - a reset, an early close
                cut = _reason(error)
                break
            if not block:
                break
            handle.write(block)
            bar.update(len(block))
            received += len(block)
            seconds = time.monotonic() - window[0]
            if limits.speed_limit and seconds >= limits.speed_time:
                rate = (received - window[1]) / seconds
                if rate < limits.speed_limit:
                    slow = f"{_too_slow(rate, seconds, limits)}, after {received} of {total} bytes"
                    raise _ended(url, slow, final, advice)
                window = (time.monotonic(), received)
    if cut is None and (size is None or received >= size):
        return
    if retries > 0 and received > offset:
        return _transfer(session, url, handle, final, limits, progress, retries - 1, advice)
    cut = cut or "the connection closed early"
    raise _ended(url, f"was cut at {received} of {total} bytes ({cut})", final, advice)


def _answer(session, url, handle, final, limits, advice) -> Optional[requests.Response]:
    """The answer to read into the part: the rest of the file after what it holds while the
    server promises the same file, else all of it (the part emptied); None when it is whole."""
    offset = handle.seek(0, os.SEEK_END)
    saved = _read_state(final, url) if offset else None
    headers = {"Range": f"bytes={offset}-", "If-Range": saved["validator"]} if saved else {}
    response = _get(session, url, headers, limits, advice)
    stated = response.headers.get("Content-Range", "").strip()
    if response.status_code == 416 and saved["size"] == offset and stated == f"bytes */{offset}":
        response.close()
        return None
    if saved and response.status_code == 206:
        header = "ETag" if saved["kind"] == "etag" else "Last-Modified"
        same = response.headers.get(header, saved["validator"]) == saved["validator"]
        if same and stated == f"bytes {offset}-{saved['size'] - 1}/{saved['size']}":
            return response
    handle.seek(0)
    handle.truncate()
    if response.status_code != 200:
        response.close()
        response = _get(session, url, {}, limits, advice)
    _save_state(final, url, response)
    return response


def _get(session, url: str, headers: dict, limits: Limits, advice: Advice) -> requests.Response:
    """The streamed answer to a GET (200, 206, or 416 to a Range); DownloadError for others."""
    try:
        response = session.get(url, headers=headers, stream=True, timeout=limits.timeout)
    except requests.RequestException as error:
        reason = _reason(error)
        if isinstance(error, requests.Timeout):
            reason = f"no answer within {limits.timeout:g} s, {TIMEOUT_VARIABLE}"
        raise DownloadError(f"cannot reach {url} ({reason}); {advice.unreachable}") from None
    if response.status_code in (200, 206) or (response.status_code == 416 and headers):
        return response
    response.close()
    status = f"HTTP {response.status_code} {response.reason}"
    raise DownloadError(f"cannot download {url}: {status}; {advice.http_error}")


def _ended(url: str, what: str, final: Path, advice: Advice) -> DownloadError:
    """The error of a transfer that ended early; its part is kept where it can be resumed."""
    kept = state_path(final).exists() and part_path(final).stat().st_size
    keep = f" ({part_path(final)} keeps what arrived)" if kept else ""
    return DownloadError(f"transfer of {url} {what}; {advice.again}{keep}")


def _too_slow(rate: float, seconds: float, limits: Limits) -> str:
    return (
        f"is too slow: {rate:.1f} bytes/s over the last {seconds:.1f} s, below "
        f"{limits.speed_limit:g} bytes/s ({SPEED_LIMIT_VARIABLE} or --speed-limit; 0 turns it "
        f"off) for {limits.speed_time:g} s ({SPEED_TIME_VARIABLE} or --speed-time)"
    )


def _save_state(final: Path, url: str, response: requests.Response) -> None:
    """Keep the validator of a whole-file answer beside the part: a strong ETag, else a
    Last-Modified a second or more before the answer's Date (RFC 9110 §8.8.2.2); else none."""
    state_path(final).unlink(missing_ok=True)
    headers = response.headers
    state = {"url": url, "kind": "etag", "validator": headers.get("ETag", "")}
    if not state["validator"].startswith('"'):  # a weak ETag (W/"...") or none
        state.update(kind="last-modified", validator=headers.get("Last-Modified", ""))
        try:
            date = parsedate_to_datetime(headers.get("Date", ""))
            if (date - parsedate_to_datetime(state["validator"])).total_seconds() < 1:
                return
        except (TypeError, ValueError):
            return
    if headers.get("Content-Length", "").isdigit():
        state["size"] = int(headers["Content-Length"])
        write_text(state_path(final), srsly.json_dumps(state))


def _read_state(final: Path, url: str) -> Optional[dict]:
    """The part's state when it is of `url` and well formed; else None."""
    try:
        state = srsly.read_json(state_path(final))
        good = state["url"] == url and isinstance(state["validator"], str) and state["validator"]
        return state if good and isinstance(state["size"], int) and state["size"] > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify(final: Path, check: Check = None, advice: Advice = Advice()) -> None:
    """A file in place against its folder's record and `check` (ChecksumError when either finds
    it changed, or it is not a regular file); a file without an entry is recorded now."""
    if not stat.S_ISREG(final.lstat().st_mode):
        raise ChecksumError(f"cached file {final} is not a regular file (a link?); {advice.force}")
    entry = _examine(final, final.name, check, advice)
    if entry is not None:
        write_record(final.parent, final.name, entry, advice=advice)


def _examine(path: Path, name: str, check: Check, advice: Advice, url="", replace=False):
    """ChecksumError (DownloadError for a download) when `check` finds `path` wrong, or it has
    not the size and sha256 the record holds for `name` (unless `replace`); the entry to record
    where the record has none, else None. A download that fails is deleted."""
    problem = check(path) if check else None
    entry = None if replace else read_record(path.parent, advice=advice).get(name)
    size, digest = path.stat().st_size, file_sha256(path)
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        problem = f"changed since it was downloaded: expected {entry['size']} bytes, sha256 "
        problem += f"{entry['sha256']}; got {size} bytes, sha256 {digest}"
    if problem and url:
        _discard(path.with_name(name))
        then = f"; {advice.force} to check it and record it instead" if entry else ""
        error = ChecksumError if entry else DownloadError
        raise error(f"{url} {problem}; the download was deleted{then}")
    if problem:
        raise ChecksumError(f"cached file {path} {problem}; {advice.force} to download it again")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    source = url or "found in the cache"
    return None if entry else {"size": size, "sha256": digest, "source": source, "recorded": now}


def read_record(folder: Path, replace: bool = False, advice: Advice = Advice()) -> dict:
    """The entries of `folder`'s record by file name; ChecksumError naming a record that is not
    one (nothing when `replace`: it is about to be rewritten)."""
    path = folder / RECORD_NAME
    if not path.exists():
        return {}
    try:
        try:
            record = srsly.read_json(path)
        except ValueError as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError('expected a JSON object with a "files" object')
        for name, entry in record["files"].items():
            size = entry.get("size") if isinstance(entry, dict) else None
            if type(size) is not int or size < 0:
                raise ValueError(f"the entry of {name} has no size in bytes: {entry!r}")
            if not re.fullmatch("[0-9a-f]{64}", str(entry.get("sha256"))):
                raise ValueError(f"the entry of {name} has no sha256 hex digest: {entry!r}")
    except (ValueError, OSError) as error:
        if replace:
            return {}
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        again = f"{advice.force} to download the files and record them again, or delete it"
        raise ChecksumError(f"checksum record {path} is not readable ({reason}); {again}") from None
    return record["files"]


def write_record(folder: Path, name: str, entry: dict, replace=False, advice=Advice()) -> None:
    """Add `name`'s entry to the folder's record (replaced whole, by rename)."""
    files = {**read_record(folder, replace, advice), name: entry}
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
