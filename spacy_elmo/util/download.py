"""One file fetched whole from a URL: resumed only when the server promises the same file,
bounded in time and in rate, checked, then installed under its final name atomically.

`fetch(url, final, check=...)` is the whole of it; `weights.published` names the files, the
cache and the checks, and calls it.

* Library: urllib3 (`urllib3>=2.2,<3`). It is installed with spaCy already (spaCy requires
  `requests`, which requires urllib3), so it adds no package. It sends the headers a resume
  needs (`Range`, `If-Range`) and hands back the response's own (`ETag`, `Last-Modified`,
  `Content-Range`) as they came; `read1` returns what has arrived, so the part grows as bytes
  arrive and a crawl is measured as it happens; `Retry` retries a refused connection and a
  429/5xx answer with backoff; `Timeout` bounds connecting and each read. pooch was the other
  candidate: it fetches and verifies files from mirrors, but starts a cut transfer again from
  byte 0 (a 374 MB weights file on a poor line never finishes) and verifies against known
  hashes, which AllenNLP does not publish; so it would have taken resume away. requests adds
  only the proxy variables over urllib3; the standard library reads them here
  (`urllib.request.getproxies` and `proxy_bypass`: `https_proxy`, `http_proxy`, `no_proxy`),
  as urllib did before. `read1` needs urllib3 2.2.
* Resumable, the same file only: the file arrives in `<file>.part`, written as bytes arrive.
  The first answer's validator (a strong `ETag`, else a `Last-Modified` at least a second
  older than the answer's `Date`), its URL and the file's size are kept beside the part in
  `<file>.part.json`, so a resume works from any later process. A resume asks for the rest with
  `Range` and `If-Range: <validator>`, and uses the answer only when it is a 206 whose
  `Content-Range` starts at the part's end and states the size kept (and whose `ETag` or
  `Last-Modified`, when sent, is the one kept). Otherwise the file starts again from byte 0: a
  part without a validator, a 200 answer (the file changed, or the server ignores Range), a
  `Content-Range` that does not match, a 416 for another size. A file that changed on the
  server between a cut and its resume therefore ends as the new file, whole.
* Bounded: a transfer that receives nothing for `SPACY_ELMO_DOWNLOAD_TIMEOUT` seconds (default
  60; connecting, waiting for the answer, or between two reads) ends with an error; so does one
  slower than `SPACY_ELMO_DOWNLOAD_SPEED_LIMIT` bytes a second (default 1024; 0 turns it off)
  over `SPACY_ELMO_DOWNLOAD_SPEED_TIME` seconds (default 30), as curl's `--speed-limit` and
  `--speed-time`. Either keeps the part for the next run. A transfer cut otherwise is resumed
  within the run (`retries` times, while each try gets further).
  The rate is measured at each read: a transfer that receives nothing at all ends by the
  timeout.
* Checked whole, recorded, atomic: a transfer must deliver the size the server announced
  (`Content-Length` or `Content-Range`); then `check(part)` (the caller's: a file format)
  runs on the whole part, and its size and sha256 are compared with the folder's record
  (`checksums.json`, trust on first use: the entry written at the file's first download)
  unless `replace`. Only then the part takes its final name (`os.replace`), so a file under
  the final name is always whole and checked, and a first download is recorded. A part that
  fails is deleted. `verify` checks a file already in place the same way.
* Local: a `file://` URL is copied (from byte 0: a local copy needs no resume).
* One writer: the part is locked (flock) while a download writes it; a second download of the
  same file stops with an error naming the part.

`check_destination` refuses a download whose destination folder is an input folder (a local
mirror), lies in one or holds one, compared by device and inode.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from http.client import HTTPException
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Optional

from .files import file_sha256, fsync_directory, lock_file, write_text

TIMEOUT_VARIABLE = "SPACY_ELMO_DOWNLOAD_TIMEOUT"
SPEED_LIMIT_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_LIMIT"
SPEED_TIME_VARIABLE = "SPACY_ELMO_DOWNLOAD_SPEED_TIME"
TIMEOUT_SECONDS = 60.0
SPEED_LIMIT = 1024.0  # bytes a second
SPEED_TIME = 30.0  # seconds
# Further attempts within one download after a transfer is cut (each resumes if it can).
RETRIES = 2
PART_SUFFIX = ".part"
STATE_SUFFIX = ".part.json"
BLOCK_BYTES = 1 << 20
RETRY_STATUSES = (429, 500, 502, 503, 504)
BACKOFF_SECONDS = 0.5
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
RECORD_NAME = "checksums.json"


class DownloadError(OSError):
    """A download that did not complete: the server, the network, the destination or a check."""


class ChecksumError(DownloadError):
    """A file whose size or sha256 is not the one recorded at its first download."""


@dataclass(frozen=True)
class Limits:
    """When a transfer ends: `timeout` seconds with nothing received, or a rate below
    `speed_limit` bytes a second (0: no limit) over `speed_time` seconds."""

    timeout: float = TIMEOUT_SECONDS
    speed_limit: float = SPEED_LIMIT
    speed_time: float = SPEED_TIME

    @classmethod
    def configured(
        cls,
        timeout: Optional[float] = None,
        speed_limit: Optional[float] = None,
        speed_time: Optional[float] = None,
    ) -> Limits:
        """The values given (an argument, a command's option), else the environment's, else
        the defaults; ValueError naming a value that is not one and where it came from."""
        seconds = "a positive number of seconds"
        return cls(
            _setting(timeout, TIMEOUT_VARIABLE, "timeout", TIMEOUT_SECONDS, seconds),
            _setting(
                speed_limit,
                SPEED_LIMIT_VARIABLE,
                "--speed-limit",
                SPEED_LIMIT,
                "a number of bytes a second >= 0 (0: no limit)",
                zero=True,
            ),
            _setting(speed_time, SPEED_TIME_VARIABLE, "--speed-time", SPEED_TIME, seconds),
        )


def _setting(
    value: Optional[float], variable: str, name: str, default: float, what: str, zero=False
) -> float:
    if value is None:
        text = os.environ.get(variable, "").strip()
        if not text:
            return default
        where = f"{variable}={text!r}"
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
    else:
        where = f"{name} {value!r} ({variable})"
    if not (0 <= value if zero else 0 < value) or value == float("inf"):
        raise ValueError(f"{where} is not {what}")
    return float(value)


@dataclass(frozen=True)
class Advice:
    """What a download's errors tell the user to do: continue a cut transfer (`again`), fetch
    a file and record it anew (`force`, followed by "to ..."), reach a server that cannot be
    reached, answer an HTTP error, write where it cannot."""

    again: str = "fetch it again to continue from there"
    force: str = "fetch it with replace=True"
    unreachable: str = ""
    http_error: str = ""
    unwritable: str = ""


def part_path(final: Path) -> Path:
    """Where `final` is written until it is whole and checked."""
    return final.with_name(final.name + PART_SUFFIX)


def state_path(final: Path) -> Path:
    """The validator, URL and size of what `part_path(final)` holds."""
    return final.with_name(final.name + STATE_SUFFIX)


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
            f"cannot write {part} ({error.strerror}){_then(advice.unwritable)}"
        ) from None
    with handle, _lock(part):
        try:
            if final.exists() and not replace:
                if _size(handle) == 0:
                    _discard(final)
                verify(final, check, advice)
                return
            if url.startswith("file:"):
                _copy(url, handle, final, progress)
            else:
                _transfer_with_retries(url, handle, final, limits, progress, retries, advice)
        except BaseException:
            if _size(handle) == 0:  # nothing arrived: leave no empty part
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
    itself, above = _identities(folder)
    for source_label, source in sources:
        source_itself, source_above = _identities(source)
        if source_itself is None:  # a source that does not exist holds nothing
            continue
        relation = None
        if itself == source_itself:
            relation = "is"
        elif source_itself in above:
            relation = "is inside"
        elif itself is not None and itself in source_above:
            relation = "holds"
        if relation:
            raise DownloadError(
                f"{label} {relation} {source_label}: a download would write into what it "
                f"reads{_then(fix)}"
            )


def _identities(path: Path) -> tuple[Optional[tuple[int, int]], set[tuple[int, int]]]:
    """(device, inode) of `path` (None when it does not exist) and of every folder above it
    that exists, following symbolic links."""
    resolved = path.expanduser().resolve()
    found: list[Optional[tuple[int, int]]] = []
    for folder in (resolved, *resolved.parents):
        try:
            stat = folder.stat()
        except OSError:
            found.append(None)
            continue
        found.append((stat.st_dev, stat.st_ino))
    return found[0], {identity for identity in found[1:] if identity is not None}


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


# ------------------------------------------------------------------------------ the transfer
@dataclass(frozen=True)
class _State:
    """What the part holds: the start of the file at `url` whose validator is `validator`
    (an ETag or an HTTP date, `kind`) and whose size is `size` (None: not announced)."""

    url: str
    kind: str
    validator: str
    size: Optional[int]


class _Cut(Exception):
    def __init__(self, reason: str, size: Optional[int], written: int, kind: str = "cut") -> None:
        super().__init__(reason)
        self.reason, self.size, self.written, self.kind = reason, size, written, kind


def _transfer_with_retries(
    url: str,
    handle: BinaryIO,
    final: Path,
    limits: Limits,
    progress: bool,
    retries: int,
    advice: Advice,
) -> None:
    """`_transfer`, again from where a cut transfer stopped, while each try gets further; a
    stalled or crawling transfer is not tried again."""
    pool = _pool(url, limits, retries)
    attempt = 0
    try:
        while True:
            try:
                _transfer(pool, url, handle, final, limits, progress, advice)
                return
            except _Cut as cut:
                received = _size(handle)
                part = part_path(final)
                keep = f" ({part} keeps what arrived)" if received else ""
                where = f"after {received} of {cut.size or '?'} bytes"
                if cut.kind == "stalled":
                    raise DownloadError(
                        f"transfer of {url} stalled: nothing arrived for {limits.timeout:g} s "
                        f"({TIMEOUT_VARIABLE}) {where}; {advice.again}{keep}"
                    ) from None
                if cut.kind == "slow":
                    raise DownloadError(
                        f"transfer of {url} is too slow: {cut.reason}, below "
                        f"{limits.speed_limit:g} bytes/s ({SPEED_LIMIT_VARIABLE} or "
                        f"--speed-limit; 0 turns it off) for {limits.speed_time:g} s "
                        f"({SPEED_TIME_VARIABLE} or --speed-time), {where}; {advice.again}{keep}"
                    ) from None
                if attempt >= retries or cut.written == 0:
                    raise DownloadError(
                        f"transfer of {url} was cut at {received} of {cut.size or '?'} bytes "
                        f"({cut.reason}); {advice.again}{keep}"
                    ) from None
                attempt += 1
    finally:
        pool.clear()


def _transfer(
    pool: Any,
    url: str,
    handle: BinaryIO,
    final: Path,
    limits: Limits,
    progress: bool,
    advice: Advice,
) -> None:
    """One request: the rest of the file after what the part holds, or all of it."""
    offset = _size(handle)
    saved = _read_state(final, url) if offset else None
    if offset and saved is None:
        offset = _restart(handle, final, "it has no validator of the file", progress)
    headers = {"Range": f"bytes={offset}-", "If-Range": saved.validator} if saved else {}
    response = _get(pool, url, headers, limits, advice)
    if saved is not None:
        response, reason = _resumed(response, offset, saved)
        if response is None and reason is None:  # a 416: the part is whole already
            return
        if reason is not None:
            offset = _restart(handle, final, reason, progress)
            if response is None:
                response = _get(pool, url, {}, limits, advice)
    size = _announced_size(response, offset, url)
    if offset == 0:
        _save_state(final, url, response, size)
    try:
        written = 0
        rate = _Rate(limits, offset)
        from tqdm import tqdm

        with tqdm(
            total=size,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=final.name,
            disable=not progress,
            file=sys.stderr,
            leave=False,
        ) as bar:
            while True:
                try:  # read1: what has arrived (up to a block), so the part grows with it
                    block = response.read1(BLOCK_BYTES, decode_content=False)
                except Exception as error:  # reset, timeout, incomplete read
                    stalled = _is_timeout(error)
                    kind = "stalled" if stalled else "cut"
                    raise _Cut(_reason(error), size, written, kind) from None
                if not block:
                    break
                _write(handle, block, final)
                written += len(block)
                bar.update(len(block))
                slow = rate.slow(offset + written)
                if slow:
                    raise _Cut(slow, size, written, "slow")
    finally:
        response.close()
    received = offset + written
    if size is not None and received < size:
        raise _Cut("the connection closed early", size, written)
    if size is not None and received > size:
        _restart(handle, final, "it is longer than the file", progress=False)
        raise DownloadError(f"{url} sent {received} bytes, more than the {size} it announced")


def _resumed(response: Any, offset: int, saved: _State) -> tuple[Any, Optional[str]]:
    """The answer to a resume: (the response to read from `offset`, None); (None, None) for a
    part that is whole; or why it cannot be used, with the response when it is the whole
    file (a 200) to read from byte 0, else None (it was closed)."""
    if response.status == 200:
        return response, "the server sent the whole file instead of the rest"
    if response.status == 416:
        response.close()
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if total == str(offset) and saved.size in (None, offset):
            return None, None
        return None, f"the server has a file of {total or '?'} bytes (a 416 answer)"
    text = response.headers.get("Content-Range", "")
    match = CONTENT_RANGE.fullmatch(text.strip())
    problem = None
    if not match:
        problem = f"the answer's Content-Range {text!r} states no byte range of a known size"
    else:
        start, end, total = map(int, match.groups())
        if start != offset or end != total - 1:
            problem = f"the answer's Content-Range {text!r} is not bytes {offset}- of the file"
        elif saved.size is not None and total != saved.size:
            problem = f"the answer's Content-Range {text!r} is not of {saved.size} bytes"
    header = "ETag" if saved.kind == "etag" else "Last-Modified"
    sent = response.headers.get(header)
    if problem is None and sent is not None and sent != saved.validator:
        problem = f"its {header} changed from {saved.validator} to {sent}"
    if problem is None:
        return response, None
    response.close()
    return None, problem


def _restart(handle: BinaryIO, final: Path, reason: str, progress: bool) -> int:
    """Empty the part (and forget its validator) to fetch the file from byte 0."""
    if progress:
        print(f"{part_path(final)}: starting again from byte 0: {reason}", file=sys.stderr)
    handle.truncate(0)
    state_path(final).unlink(missing_ok=True)
    return 0


class _Rate:
    """A transfer's rate over its last `speed_time` seconds (or more), from samples of the
    bytes received, taken at each read (at most 100 per `speed_time`)."""

    def __init__(self, limits: Limits, received: int) -> None:
        self.limit, self.span = limits.speed_limit, limits.speed_time
        self.samples = deque([(time.monotonic(), received)])

    def slow(self, received: int) -> Optional[str]:
        """The rate measured, when it is below the limit over the last `speed_time` s."""
        if not self.limit:
            return None
        now = time.monotonic()
        if now - self.samples[-1][0] >= self.span / 100:
            self.samples.append((now, received))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.span:
            self.samples.popleft()
        start, at_start = self.samples[0]
        if now - start < self.span:
            return None
        rate = (received - at_start) / (now - start)
        return (
            f"{rate:.1f} bytes/s over the last {now - start:.1f} s" if rate < self.limit else None
        )


def _pool(url: str, limits: Limits, retries: int) -> Any:
    """A urllib3 pool for `url`: through the proxy the environment names for it, if any."""
    import urllib3

    settings = {
        "timeout": urllib3.Timeout(connect=limits.timeout, read=limits.timeout),
        "retries": urllib3.Retry(
            total=None,
            connect=retries,
            read=0,  # an answer that does not come in `timeout` is not waited for again
            redirect=5,
            status=retries,
            status_forcelist=RETRY_STATUSES,
            backoff_factor=BACKOFF_SECONDS,
            raise_on_status=False,
            respect_retry_after_header=False,
        ),
    }
    parts = urllib.parse.urlsplit(url)
    proxy = None
    if not urllib.request.proxy_bypass(parts.hostname or ""):
        proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy:
        return urllib3.ProxyManager(proxy, **settings)
    return urllib3.PoolManager(**settings)


def _get(pool: Any, url: str, headers: dict[str, str], limits: Limits, advice: Advice) -> Any:
    """The response to a GET of `url` (200, 206 or 416); DownloadError for any other."""
    import urllib3

    headers = {"User-Agent": "spacy-elmo", "Accept-Encoding": "identity", **headers}
    try:
        response = pool.request(
            "GET", url, headers=headers, preload_content=False, decode_content=False
        )
    except (urllib3.exceptions.HTTPError, OSError, HTTPException) as error:
        error = getattr(error, "reason", None) or error
        reason = _reason(error)
        if _is_timeout(error):
            reason = f"no answer within {limits.timeout:g} s, {TIMEOUT_VARIABLE}"
        raise DownloadError(f"cannot reach {url} ({reason}){_then(advice.unreachable)}") from None
    if response.status in (200, 206) or (response.status == 416 and "Range" in headers):
        return response
    response.close()
    raise DownloadError(
        f"cannot download {url}: HTTP {response.status} {response.reason}{_then(advice.http_error)}"
    )


def _announced_size(response: Any, offset: int, url: str) -> Optional[int]:
    """The whole file's size as the response states it (Content-Range, else Content-Length);
    DownloadError for a 206 that is not the rest of the file from byte `offset`."""
    if response.status == 206:
        text = response.headers.get("Content-Range", "")
        match = CONTENT_RANGE.fullmatch(text.strip())
        if (
            not match
            or int(match.group(1)) != offset
            or int(match.group(2)) + 1 != int(match.group(3))
        ):
            response.close()
            raise DownloadError(
                f"{url} answered a request from byte {offset} with Content-Range {text!r}"
            )
        return int(match.group(3))
    length = response.headers.get("Content-Length", "")
    return int(length) if length.isdigit() else None


def _save_state(final: Path, url: str, response: Any, size: Optional[int]) -> None:
    """Keep the validator of a whole-file answer beside the part (or none: no resume)."""
    etag = response.headers.get("ETag", "")
    modified = response.headers.get("Last-Modified", "")
    if etag.startswith('"'):  # a strong ETag ("..."; a weak one is W/"...")
        kind, validator = "etag", etag
    elif modified and _strong_date(modified, response.headers.get("Date", "")):
        kind, validator = "last-modified", modified
    else:
        state_path(final).unlink(missing_ok=True)
        return
    state = {"url": url, "kind": kind, "validator": validator, "size": size}
    write_text(state_path(final), json.dumps(state) + "\n")


def _strong_date(modified: str, date: str) -> bool:
    """A Last-Modified is a strong validator when the answer's Date is a second or more after
    it (RFC 9110 §8.8.2.2): a file changed within that second could keep the date."""
    try:
        return (parsedate_to_datetime(date) - parsedate_to_datetime(modified)).total_seconds() >= 1
    except (TypeError, ValueError):
        return False


def _read_state(final: Path, url: str) -> Optional[_State]:
    """The state kept beside the part, when it is of `url` and well formed; else None."""
    try:
        state = json.loads(state_path(final).read_text(encoding="utf-8"))
        found = _State(state["url"], state["kind"], state["validator"], state["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    size_ok = found.size is None or (isinstance(found.size, int) and found.size >= 0)
    if found.url != url or found.kind not in ("etag", "last-modified") or not size_ok:
        return None
    return found if isinstance(found.validator, str) and found.validator else None


def _copy(url: str, handle: BinaryIO, final: Path, progress: bool) -> None:
    """A file:// URL: the whole file into the part."""
    source = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    handle.truncate(0)
    state_path(final).unlink(missing_ok=True)
    from tqdm import tqdm

    try:
        with (
            source.open("rb") as reader,
            tqdm(
                total=source.stat().st_size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=final.name,
                disable=not progress,
                file=sys.stderr,
                leave=False,
            ) as bar,
        ):
            for block in iter(lambda: reader.read(BLOCK_BYTES), b""):
                _write(handle, block, final)
                bar.update(len(block))
    except OSError as error:
        raise DownloadError(f"cannot read {source} ({error.strerror or error})") from None


# ------------------------------------------------------------------------------ small parts
def _write(handle: BinaryIO, block: bytes, final: Path) -> None:
    try:
        handle.write(block)
        handle.flush()
    except OSError as error:
        raise DownloadError(f"cannot write {part_path(final)} ({error.strerror})") from None


def _size(handle: BinaryIO) -> int:
    return handle.seek(0, os.SEEK_END)


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


def _then(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _is_timeout(error: BaseException) -> bool:
    import urllib3

    if isinstance(error, urllib3.exceptions.NewConnectionError):
        return False
    return isinstance(error, (TimeoutError, urllib3.exceptions.TimeoutError))


def _reason(error: BaseException) -> str:
    """A network error in a few words: the system's, else the error's own."""
    if _is_timeout(error):
        return "timed out"
    if "IncompleteRead" in type(error).__name__ or "IncompleteRead" in str(error):
        return "the connection closed early"
    cause: Optional[BaseException] = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    text = str(error)
    return text.rpartition(": ")[2] if ": " in text else text or type(error).__name__
