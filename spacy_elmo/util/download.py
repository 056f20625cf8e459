"""One file fetched whole from an http(s) URL (`fetch`), thin over requests, filelock, srsly, tqdm.

A cut transfer resumes only while the server promises the same file (If-Range on a strong
validator); the whole file is checked against its folder's record before it takes its name.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path
from typing import BinaryIO, Callable, NamedTuple, Optional

import requests
import srsly
import urllib3
from tqdm import tqdm

from .files import file_sha256, fsync_directory, write_text

TIMEOUT_VARIABLE = "SPACY_ELMO_DOWNLOAD_TIMEOUT"
SPEED_LIMIT_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_LIMIT"
SPEED_TIME_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_TIME"
RETRIES = 2  # further tries after a refused connection or a 429/5xx answer (urllib3's)
RETRY_STATUSES = (429, 500, 502, 503, 504)
PART_SUFFIX = ".part"
RECORD_NAME = "checksums.json"
Check = Optional[Callable[[Path], Optional[str]]]  # what is wrong with a file, if anything


class DownloadError(OSError):
    """A download that did not complete: the server, the network, the destination or a check."""


class ChecksumError(DownloadError):
    """A file that fails its check, or has not the size and sha256 recorded at its download."""


class Limits(NamedTuple):
    """A transfer's bounds: `timeout` s receiving nothing, `speed_limit` B/s over `speed_time` s."""

    timeout: float = 60.0
    speed_limit: float = 1024.0
    speed_time: float = 30.0

    @classmethod
    def configured(cls, timeout=None, speed_limit=None, speed_time=None) -> Limits:
        """Each value given, else SPACY_ELMO_DOWNLOAD_<FIELD>, else its default; all checked."""
        given = {"timeout": timeout, "speed_limit": speed_limit, "speed_time": speed_time}
        for field, default in cls._field_defaults.items():
            value, variable = given[field], f"SPACY_ELMO_DOWNLOAD_{field.upper()}"
            where = f"--{field.replace('_', '-')} {value!r} ({variable})"
            if value is None:
                text = os.environ.get(variable, "").strip() or str(default)
                where = f"{variable}={text!r}"
                value = float(text) if text.replace(".", "", 1).isdigit() else math.nan
            if not (0 < value < math.inf or value == 0 and field == "speed_limit"):
                zero = " or 0 (no limit)" if field == "speed_limit" else ""
                raise ValueError(f"{where} is not a positive number{zero}")
            given[field] = float(value)
        return cls(**given)


def part_path(final: Path) -> Path:
    return final.with_name(final.name + PART_SUFFIX)


def state_path(final: Path) -> Path:
    return final.with_name(final.name + PART_SUFFIX + ".json")


def fetch(
    url: str,
    final: Path,
    check: Check = None,
    replace: bool = False,
    limits: Limits = Limits(),
    progress: bool = True,
    retries: int = RETRIES,
    command: str = "spacy-elmo download",
    hint: str = "check the URL, or set https_proxy for a proxy",
) -> None:
    """`url` into `final` under a lock, checked by `verify`; errors advise `command` and `hint`."""
    # Imported here: importing filelock registers a fork hook (tests/pipeline/test_spacy_untouched)
    from filelock import FileLock, Timeout

    part = part_path(final)
    retry = urllib3.Retry(
        retries, read=0, backoff_factor=0.5, status_forcelist=RETRY_STATUSES, raise_on_status=False
    )
    try:
        with FileLock(f"{final}.lock", blocking=False), requests.Session() as session:
            session.mount("http", requests.adapters.HTTPAdapter(max_retries=retry))
            session.headers.update({"User-Agent": "spacy-elmo", "Accept-Encoding": "identity"})
            try:
                with _open_part(final) as handle:
                    _transfer(session, url, handle, final, limits, progress, command, hint)
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
    except requests.RequestException as error:
        reason = _reason(error)
        if isinstance(error, requests.Timeout):
            reason = f"no answer within {limits.timeout:g} s, {TIMEOUT_VARIABLE}"
        where = f"cannot reach {url} ({reason}); offline or behind a proxy?"
        raise DownloadError(f"{where} {hint}") from None


def _open_part(final: Path) -> BinaryIO:
    """The part there when it is a regular file of one name (never a link), else a new one."""
    part = part_path(final)
    reusable = not part.is_symlink() and part.is_file() and part.stat().st_nlink == 1
    if not reusable:
        _discard(final)  # whatever is at that name, a link included, is unlinked
    flags = os.O_RDWR | os.O_NOFOLLOW | (0 if reusable else os.O_CREAT | os.O_EXCL)
    return os.fdopen(os.open(part, flags, 0o666), "r+b", buffering=0)  # grows with the bytes


def _transfer(session, url, handle, final, limits, progress, command, hint) -> None:
    """One answer into the part; a cut, a stall or a crawl ends the download, the part kept."""
    response = _answer(session, url, handle, final, limits, hint)
    offset = received = handle.tell()
    length = response.headers.get("Content-Length", "")
    size = offset + int(length) if length.isdigit() else None
    ended, window = "", (time.monotonic(), offset)  # the rate's window: its start, bytes then
    bar = {"total": size, "initial": offset, "desc": final.name, "disable": not progress}
    with response, tqdm.wrapattr(handle, "write", leave=False, **bar) as part:
        while not ended:
            try:  # read1: what has arrived, so that the part grows and a crawl is measured
                block = response.raw.read1(1 << 20, decode_content=False)
            except urllib3.exceptions.ReadTimeoutError:
                stalled = f"{limits.timeout:g} s ({TIMEOUT_VARIABLE})"
                block, ended = b"", f"stalled: nothing arrived for {stalled}"
            except Exception as error:  # noqa: BLE001 - a reset, an early close
                block, ended = b"", f"was cut ({_reason(error)})"
            if not block:
                break
            received += part.write(block)
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
    if not ended and (size is None or received >= size):
        return
    ended = f"{ended or 'was cut (the connection closed early)'} after {received} of {size or '?'}"
    kept = received and state_path(final).exists()
    keep = f" ({part_path(final)} keeps what arrived)" if kept else ""
    raise DownloadError(f"transfer of {url} {ended} bytes; run `{command}` again to continue{keep}")


def _answer(session, url, handle, final, limits, hint) -> requests.Response:
    """The rest of the same file after the part (a 206 of its range), else all of it anew."""
    offset = handle.seek(0, os.SEEK_END)
    try:  # the validator of the file that the part holds the start of, and that file's size
        saved = srsly.read_json(state_path(final))
        saved = saved if offset and saved["url"] == url and saved["header"] else None
    except (OSError, ValueError, LookupError, TypeError):
        saved = None
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
    if not response.ok:
        status = f"HTTP {response.status_code} {response.reason}"
        raise DownloadError(f"cannot download {url}: {status}; {hint}")
    state_path(final).unlink(missing_ok=True)
    answer, length = response.headers, response.headers.get("Content-Length", "")
    header = "ETag" if answer.get("ETag", "").startswith('"') else "Last-Modified"  # not W/
    if header in answer and length.isdigit():
        state = {"url": url, "header": header, "validator": answer[header], "size": int(length)}
        write_text(state_path(final), srsly.json_dumps(state))
    return response


def verify(path: Path, check: Check, command: str, url: str = "", replace: bool = False) -> None:
    """`path` (cached, or the part of `url`: deleted when wrong) checked whole; recorded if new."""
    name = path.name.removesuffix(PART_SUFFIX) if url else path.name
    problem = check(path) if check else None
    entry = None if replace else read_record(path.parent, command).get(name)
    size, digest = path.stat().st_size, file_sha256(path)
    if entry is not None and (size, digest) != (entry["size"], entry["sha256"]):
        problem = f"changed since it was downloaded: expected {entry['size']} bytes, sha256 "
        problem += f"{entry['sha256']}; got {size} bytes, sha256 {digest}"
    if problem and url:
        _discard(path.with_name(name))
        problem += "; the download was deleted"
    if problem and (entry or not url):  # a new download that fails its check: nothing to force
        problem += f"; run `{command} --force` to download it and record it anew"
    if problem:
        raise ChecksumError(f"{url or f'cached file {path}'} {problem}")
    if entry is None:
        entry = {"size": size, "sha256": digest, "source": url or "found in the cache"}
        files = {**read_record(path.parent, command, replace), name: entry}
        write_text(path.parent / RECORD_NAME, srsly.json_dumps({"files": files}, indent=2))


def read_record(folder: Path, command: str, replace: bool = False) -> dict:
    """`folder`'s record by file name; ChecksumError names a bad one (but for `replace`: none)."""
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


def _discard(final: Path) -> None:
    part_path(final).unlink(missing_ok=True)
    state_path(final).unlink(missing_ok=True)


def _reason(error: BaseException) -> str:
    """A network error in a few words: the system's (Connection refused), else its own."""
    cause: Optional[BaseException] = error
    while cause is not None and not (isinstance(cause, OSError) and cause.strerror):
        cause = cause.__cause__ or cause.__context__
    return cause.strerror if cause else str(error).rpartition(": ")[2] or type(error).__name__
