"""One file's transfer from a URL into its part, `<file>.part`: resumed only when the server
promises the same file, bounded in time and in rate. `util.download.fetch` locks the part, calls
`transfer_with_retries` (or `copy_local` for a `file://` URL), then checks and installs the file.
What this module and `util.download` share lives here, below it: `Limits`, `Advice`,
`DownloadError`, the variable names and defaults, `part_path` and `state_path`.

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
* Local: a `file://` URL is copied (from byte 0: a local copy needs no resume).
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
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from http.client import HTTPException
from pathlib import Path
from typing import Any, BinaryIO, Optional

from .files import write_text

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


class DownloadError(OSError):
    """A download that did not complete: the server, the network, the destination or a check."""


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


def transfer_with_retries(
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
                received = handle_size(handle)
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
    offset = handle_size(handle)
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
        with _progress_bar(final, size, offset, progress) as bar:
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
        raise DownloadError(f"cannot reach {url} ({reason}){then(advice.unreachable)}") from None
    if response.status in (200, 206) or (response.status == 416 and "Range" in headers):
        return response
    response.close()
    raise DownloadError(
        f"cannot download {url}: HTTP {response.status} {response.reason}{then(advice.http_error)}"
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


def copy_local(url: str, handle: BinaryIO, final: Path, progress: bool) -> None:
    """A file:// URL: the whole file into the part."""
    source = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
    handle.truncate(0)
    state_path(final).unlink(missing_ok=True)
    try:
        with (
            source.open("rb") as reader,
            _progress_bar(final, source.stat().st_size, 0, progress) as bar,
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


def handle_size(handle: BinaryIO) -> int:
    """How many bytes the open part holds (its position is left at its end)."""
    return handle.seek(0, os.SEEK_END)


def then(hint: str) -> str:
    """`hint` as the end of a message ("; hint"), or nothing."""
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


def _progress_bar(final: Path, size: Optional[int], offset: int, progress: bool) -> Any:
    """The bytes of `final` arriving on standard error, from `offset` of `size` (None: unknown),
    gone when done; nothing unless `progress`."""
    from tqdm import tqdm

    return tqdm(
        total=size,
        initial=offset,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=final.name,
        disable=not progress,
        file=sys.stderr,
        leave=False,
    )
