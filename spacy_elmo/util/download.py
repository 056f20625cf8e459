"""One file fetched whole from a URL: resumed only while the server promises the same file,
bounded in time and rate, checked against its record, then moved into place.

requests sends the requests (proxies from the environment, urllib3's `Retry` for a refused
connection or a 429/5xx), filelock keeps one writer per file, tqdm shows the bytes arriving.
`<file>.part` holds what has arrived and `<file>.part.json` its URL, validator (a strong ETag,
else a Last-Modified a second before the answer's Date) and size: a resume sends `If-Range` and
keeps the part only for a 206 that continues it; any other answer starts again from byte 0.
A transfer that receives nothing for `timeout` s, or less than `speed_limit` bytes/s over
`speed_time` s, ends with an error and keeps the part. The whole part is checked (`check`),
compared with the folder's `checksums.json` (its first download's size and sha256) and renamed
over the final name. Files are only created here (O_EXCL), opened without following a link
(O_NOFOLLOW) and replaced by rename: nothing is ever written through a link planted beside.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

import srsly

from .files import file_sha256, fsync_directory, write_text

TIMEOUT_VARIABLE = "SPACY_ELMO_DOWNLOAD_TIMEOUT"
SPEED_LIMIT_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_LIMIT"
SPEED_TIME_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_TIME"
RETRIES = 2  # further tries within one download after a transfer is cut, each resumed
PART_SUFFIX, STATE_SUFFIX, RECORD_NAME = ".part", ".part.json", "checksums.json"
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
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
        """The values given, else the environment's, else the defaults; ValueError naming a
        value that is not one and where it came from."""
        values = []
        for value, variable, name, default in [
            (timeout, TIMEOUT_VARIABLE, "timeout", cls.timeout),
            (speed_limit, SPEED_LIMIT_VARIABLE, "--speed-limit", cls.speed_limit),
            (speed_time, SPEED_TIME_VARIABLE, "--speed-time", cls.speed_time),
        ]:
            where, text = f"{name} {value!r} ({variable})", os.environ.get(variable, "").strip()
            if value is None:
                where = f"{variable}={text!r}"
                value = default if not text else float(text) if _is_number(text) else -1.0
            rate = variable == SPEED_LIMIT_VARIABLE
            if not (0 <= value if rate else 0 < value) or value == float("inf"):
                what = "a number of bytes a second >= 0 (0: no limit)" if rate else "a positive"
                raise ValueError(f"{where} is not {what}{'' if rate else ' number of seconds'}")
            values.append(float(value))
        return cls(*values)


@dataclass(frozen=True)
class Advice:
    """What a download's errors tell the user to do."""

    again: str = "fetch it again to continue from there"
    force: str = "fetch it with replace=True"
    unreachable: str = ""
    http_error: str = ""
    unwritable: str = ""


def part_path(final: Path) -> Path:
    return final.with_name(final.name + PART_SUFFIX)


def state_path(final: Path) -> Path:
    return final.with_name(final.name + STATE_SUFFIX)


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
    from filelock import FileLock, Timeout

    part, limits, unwritable = part_path(final), limits or Limits.configured(), advice.unwritable
    try:
        with FileLock(f"{final}.lock", blocking=False):
            if final.exists() and not replace:
                _discard(final)
                return verify(final, check, advice)
            handle = _open_part(final, url)
            try:
                with handle:
                    if url.startswith("file:"):
                        path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
                        with open(path, "rb") as source:
                            shutil.copyfileobj(source, handle)
                    else:
                        _transfer_with_retries(
                            url, handle, final, limits, progress, retries, advice
                        )
                    os.fsync(handle.fileno())
                entry = _checked(part, final.name, check, advice, url, replace)
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
    except OSError as error:
        if isinstance(error, DownloadError):
            raise
        what = f"read {error.filename}" if url.startswith("file:") else f"write {part}"
        hint = f"; {unwritable}" if unwritable and "write" in what else ""
        raise DownloadError(f"cannot {what} ({error.strerror or error}){hint}") from None


def _open_part(final: Path, url: str) -> BinaryIO:
    """The part there when its record names `url` and it is a file of one name (opened without
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


class _Cut(Exception):
    """A transfer that ended early: (reason, "cut", "stalled" or "slow", size)."""


def _transfer_with_retries(url, handle, final, limits, progress, retries, advice) -> None:
    """`_transfer` again from where a cut transfer stopped, while each try gets further."""
    import requests
    from urllib3 import Retry

    retry = Retry(connect=retries, read=0, status=retries, backoff_factor=0.5,
                  status_forcelist=(429, 500, 502, 503, 504), raise_on_status=False)  # fmt: skip
    with requests.Session() as session:
        session.mount("http", requests.adapters.HTTPAdapter(max_retries=retry))
        for attempt in range(retries + 1):
            before = handle.seek(0, os.SEEK_END)
            try:
                return _transfer(session, url, handle, final, limits, progress, advice)
            except _Cut as cut:
                reason, kind, size = cut.args
                received = handle.seek(0, os.SEEK_END)
                if kind == "cut" and attempt < retries and received > before:
                    continue
                where = f"{received} of {size or '?'} bytes"
                reason = {
                    "cut": f"was cut at {where} ({reason})",
                    "stalled": f"stalled: nothing arrived for {limits.timeout:g} s "
                    f"({TIMEOUT_VARIABLE}) after {where}",
                    "slow": f"is too slow: {reason}, below {limits.speed_limit:g} bytes/s "
                    f"({SPEED_LIMIT_VARIABLE} or --speed-limit; 0 turns it off) for "
                    f"{limits.speed_time:g} s ({SPEED_TIME_VARIABLE} or --speed-time), "
                    f"after {where}",
                }[kind]
                keep = f" ({part_path(final)} keeps what arrived)" if received else ""
                raise DownloadError(f"transfer of {url} {reason}; {advice.again}{keep}") from None


def _transfer(session, url, handle, final, limits, progress, advice) -> None:
    """One request: the rest of the file after what the part holds, or all of it."""
    offset = handle.seek(0, os.SEEK_END)
    saved = _read_state(final, url) if offset else None
    headers = {"Range": f"bytes={offset}-", "If-Range": saved["validator"]} if saved else {}
    response = _get(session, url, headers, limits, advice)
    stated = response.headers.get("Content-Range", "").strip()
    whole = saved and saved["size"] == offset and stated == f"bytes */{offset}"
    if response.status_code == 416 and whole:
        return response.close()  # the part is whole already
    match = CONTENT_RANGE.fullmatch(stated)
    sent = response.headers.get("ETag" if saved and saved["kind"] == "etag" else "Last-Modified")
    rest = [offset, saved["size"] - 1, saved["size"]] if saved else None
    same = saved and sent in (None, saved["validator"])
    if not (same and match and [int(n) for n in match.groups()] == rest):
        handle.truncate(offset := handle.seek(0))  # not the rest of the part's file: all of it
        if response.status_code != 200:
            response.close()
            response = _get(session, url, {}, limits, advice)
        _save_state(final, url, response)
    length = response.headers.get("Content-Length", "")
    size = offset + int(length) if length.isdigit() else None
    received, window = offset, (time.monotonic(), offset)
    with response, _bar(final, size, offset, progress) as bar:
        while True:
            try:  # read1: what has arrived, so that the part grows and a crawl is measured
                block = response.raw.read1(1 << 20, decode_content=False)
            except Exception as error:  # noqa: BLE001 - a reset, a timeout, an early close
                stalled = "timed out" in str(error).lower()
                raise _Cut(_reason(error), "stalled" if stalled else "cut", size) from None
            if not block:
                break
            handle.write(block)
            bar.update(len(block))
            received, now = received + len(block), time.monotonic()
            if limits.speed_limit and now - window[0] >= limits.speed_time:
                rate = (received - window[1]) / (now - window[0])
                if rate < limits.speed_limit:
                    measured = f"{rate:.1f} bytes/s over the last {now - window[0]:.1f} s"
                    raise _Cut(measured, "slow", size)
                window = (now, received)
    if size is not None and received < size:
        raise _Cut("the connection closed early", "cut", size)


def _get(session, url: str, headers: dict, limits: Limits, advice: Advice) -> Any:
    """The streamed answer to a GET (200, 206, or 416 to a Range); DownloadError for others."""
    import requests

    headers = {"User-Agent": "spacy-elmo", "Accept-Encoding": "identity", **headers}
    try:
        response = session.get(url, headers=headers, stream=True, timeout=limits.timeout)
    except requests.RequestException as error:
        reason = _reason(error)
        if isinstance(error, requests.Timeout):
            reason = f"no answer within {limits.timeout:g} s, {TIMEOUT_VARIABLE}"
        hint = f"; {advice.unreachable}" if advice.unreachable else ""
        raise DownloadError(f"cannot reach {url} ({reason}){hint}") from None
    if response.status_code in (200, 206) or (response.status_code == 416 and "Range" in headers):
        return response
    response.close()
    hint = f"; {advice.http_error}" if advice.http_error else ""
    status = f"HTTP {response.status_code} {response.reason}"
    raise DownloadError(f"cannot download {url}: {status}{hint}")


def _save_state(final: Path, url: str, response) -> None:
    """Keep the validator of a whole-file answer beside the part (or none: no resume)."""
    state_path(final).unlink(missing_ok=True)
    etag, modified = response.headers.get("ETag", ""), response.headers.get("Last-Modified", "")
    length = response.headers.get("Content-Length", "")
    state = {"url": url, "kind": "etag", "validator": etag, "size": int(length or -1)}
    if not etag.startswith('"'):  # a weak ETag (W/"...") promises no byte-for-byte copy
        try:  # RFC 9110 §8.8.2.2: a date is strong a second or more before the answer's
            date = parsedate_to_datetime(response.headers.get("Date", ""))
            if (date - parsedate_to_datetime(modified)).total_seconds() < 1:
                return
        except (TypeError, ValueError):
            return
        state.update(kind="last-modified", validator=modified)
    write_text(state_path(final), srsly.json_dumps(state))


def _read_state(final: Path, url: str) -> Optional[dict]:
    """The part's record when it is of `url` and well formed; else None."""
    try:
        state = srsly.read_json(state_path(final))
        good = state["kind"] in ("etag", "last-modified") and isinstance(state["validator"], str)
        good = good and state["url"] == url and isinstance(state["size"], int)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if good and state["validator"] and state["size"] > 0 else None


# ------------------------------------------------------------------------------ the record
def verify(final: Path, check: Check = None, advice: Advice = Advice()) -> None:
    """A file in place against its folder's record and `check` (ChecksumError when either finds
    it changed, or it is not a regular file); a file without an entry is recorded now."""
    if not stat.S_ISREG(final.lstat().st_mode):
        raise ChecksumError(f"cached file {final} is not a regular file (a link?); {advice.force}")
    entry = _checked(final, final.name, check, advice)
    if entry is not None:
        write_record(final.parent, final.name, entry, advice=advice)


def _checked(path: Path, name: str, check: Check, advice: Advice, url="", replace=False) -> Any:
    """ChecksumError (DownloadError for a download) when `check` finds `path` wrong, or it has
    not the size and sha256 the record holds for `name` (unless `replace`); the entry to record
    where the record has none, else None. A download that fails is deleted."""
    cached = f"cached file {path}"
    problem = check(path) if check else None
    entry = None if replace else read_record(path.parent, advice=advice).get(name)
    size, digest = path.stat().st_size, file_sha256(path)
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        problem = "is not the file recorded at its first download" if url else "changed since"
        problem += f"{'' if url else ' it was downloaded'}: expected {entry['size']} bytes, "
        problem += f"sha256 {entry['sha256']}; got {size} bytes, sha256 {digest}"
    if problem and url:
        _discard(path.with_name(name))
        then = f"; {advice.force} to check it and record it instead" if entry else ""
        error = ChecksumError if entry else DownloadError
        raise error(f"{url} {problem}; the download was deleted{then}")
    if problem:
        raise ChecksumError(f"{cached} {problem}; {advice.force} to download it again")
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
        text = path.read_text(encoding="utf-8")
        try:
            record = srsly.json_loads(text)
        except ValueError as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError('expected a JSON object with a "files" object')
        for name, entry in record["files"].items():
            size = entry.get("size") if isinstance(entry, dict) else None
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
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


def _is_number(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d*)?|\.\d+", text) is not None


def _reason(error: BaseException) -> str:
    """A network error in a few words: the system's, else the error's own."""
    if "IncompleteRead" in repr(error):
        return "the connection closed early"
    cause: Any = error
    while isinstance(cause, BaseException):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__ or getattr(cause, "reason", None)
    return str(error).rpartition(": ")[2] or type(error).__name__


def _bar(final: Path, size: Optional[int], offset: int, progress: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=size, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                desc=final.name, disable=not progress, file=sys.stderr, leave=False)  # fmt: skip
