"""`util.download.fetch` against an HTTP server on 127.0.0.1 in this process (never the network).

The server sends a strong ETag (or a Last-Modified, a weak ETag, none) and answers Range and
If-Range as RFC 9110 says, unless told to misbehave: answer a ranged request with 200, apply a
Range whatever its If-Range, state a wrong Content-Range, cut a response after some bytes, or
drip the body a few bytes at a time. Each test checks the installed file against the bytes
served (sha256) and the requests the client sent.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from email.utils import formatdate
from pathlib import Path
from typing import Callable, Optional

import pytest

from spacy_elmo.util.download import (
    SPEED_LIMIT_VARIABLE,
    SPEED_TIME_VARIABLE,
    TIMEOUT_VARIABLE,
    DownloadError,
    Limits,
    fetch,
    part_path,
    state_path,
)

SIZE = 300_000
PATH = "/files/data.bin"
# No rate limit: the transfers below are local and fast, but a loaded machine may pause.
FAST = Limits(timeout=10, speed_limit=0, speed_time=30)
ROOT = Path(__file__).resolve().parents[2]
# Loads spacy_elmo/util as a package of its own (argv[1]: its folder; no torch), fetches
# argv[2] into argv[3] with no retries, and prints the DownloadError it ends with, if any.
FETCH_IN_ANOTHER_PROCESS = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location(
    "elmo_util", Path(sys.argv[1]) / "__init__.py", submodule_search_locations=[sys.argv[1]]
)
package = importlib.util.module_from_spec(spec)
sys.modules["elmo_util"] = package
spec.loader.exec_module(package)
from elmo_util.download import DownloadError, Limits, fetch
try:
    fetch(sys.argv[2], Path(sys.argv[3]), progress=False, retries=0, limits=Limits(10, 0, 30))
except DownloadError as error:
    print(f"DownloadError: {error}")
"""


def payload(seed: int) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (SIZE // 32) + b"end"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def etag(data: bytes) -> str:
    return f'"{sha256(data)[:16]}"'


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.log: list[tuple[Optional[str], Optional[str], int]] = []  # Range, If-Range, status
        self.validators = "etag"  # or "last-modified", "weak", "none"
        self.ranges = "rfc"  # "rfc"; "always": Range whatever If-Range says; "never": a 200
        self.content_range: Optional[Callable[[int, int, int], str]] = None  # a wrong one
        self.cuts: list[int] = []  # each next response ends after this many bytes
        self.drip: Optional[tuple[int, float]] = None  # (bytes, seconds) at a time
        self.closing = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{PATH}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server = self.server
        data = server.files.get(self.path)
        requested, if_range = self.headers.get("Range"), self.headers.get("If-Range")
        if data is None:
            self.send_error(404, "Not Found")
            return
        validator = {
            "etag": ("ETag", etag(data)),
            "weak": ("ETag", f"W/{etag(data)}"),
            "last-modified": (
                "Last-Modified",
                formatdate(1e9 + int(sha256(data)[:6], 16), usegmt=True),
            ),
        }.get(server.validators)
        start = None
        if requested and server.ranges != "never":
            same = if_range is None or (validator is not None and if_range == validator[1])
            if same or server.ranges == "always":
                start = int(requested.removeprefix("bytes=").rstrip("-"))
        if start is not None and start >= len(data):
            server.log.append((requested, if_range, 416))
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = 200 if start is None else 206
        server.log.append((requested, if_range, status))
        body = data[start or 0 :]
        self.send_response(status)
        if validator is not None:
            self.send_header(*validator)
        if status == 206:
            content_range = server.content_range or (lambda s, e, t: f"bytes {s}-{e}/{t}")
            self.send_header("Content-Range", content_range(start, len(data) - 1, len(data)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.close_connection = True
        if server.cuts:
            self.wfile.write(body[: server.cuts.pop(0)])  # then the connection closes
            return
        if server.drip:
            step, pause = server.drip
            for at in range(0, len(body), step):
                if server.closing.wait(pause):
                    return
                try:
                    self.wfile.write(body[at : at + step])
                    self.wfile.flush()
                except OSError:  # the client hung up
                    return
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    server = Server()
    server.files[PATH] = payload(0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.closing.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def final(tmp_path) -> Path:
    return tmp_path / "cache" / "data.bin"


def cut_transfer(server: Server, final: Path, at: int) -> None:
    """A fetch cut after `at` bytes: its part holds them, where a validator lets them be
    resumed (else no part is kept)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    server.cuts = [at]
    with pytest.raises(DownloadError, match=rf"was cut \(.*\) after {at} of {SIZE + 3} bytes"):
        fetch(server.url, final, progress=False, retries=0, limits=FAST)
    kept = part_path(final).stat().st_size if part_path(final).exists() else None
    assert kept == (at if state_path(final).exists() else None)


# ------------------------------------------------------------------------ the same file only
def test_a_file_changed_between_a_cut_and_its_resume_ends_as_the_new_file(server, final):
    old, new = payload(0), payload(1)
    cut_transfer(server, final, 100_000)
    assert json.loads(state_path(final).read_text())["validator"] == etag(old)
    server.files[PATH] = new  # same size, other bytes
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(new)
    # The resume asked for the rest of the old file only; the server sent the new one whole.
    assert server.log == [(None, None, 200), ("bytes=100000-", etag(old), 200)]
    assert not part_path(final).exists() and not state_path(final).exists()


def test_the_same_file_resumes_where_it_was_cut(server, final):
    cut_transfer(server, final, 100_000)
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(0))
    assert server.log[-1] == ("bytes=100000-", etag(payload(0)), 206)


def test_a_last_modified_well_before_the_answer_is_a_validator(server, final):
    server.validators = "last-modified"
    cut_transfer(server, final, 100_000)
    modified = json.loads(state_path(final).read_text())["validator"]
    assert modified.endswith(" GMT")
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(0))
    assert server.log[-1] == ("bytes=100000-", modified, 206)


@pytest.mark.parametrize("validators", ["none", "weak"])
def test_without_a_strong_validator_the_resume_starts_from_byte_0(server, final, validators):
    server.validators = validators
    cut_transfer(server, final, 100_000)
    assert not state_path(final).exists()
    server.files[PATH] = payload(1)
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(1))
    assert [request[:2] for request in server.log] == [(None, None), (None, None)]


def test_a_200_to_a_ranged_request_restarts(server, final):
    cut_transfer(server, final, 100_000)
    server.ranges = "never"
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(0))  # not the head twice
    assert server.log[-1] == ("bytes=100000-", etag(payload(0)), 200)
    assert len(server.log) == 2  # its body was the whole file: no third request


@pytest.mark.parametrize(
    "content_range",
    [
        lambda s, e, t: f"bytes {s + 1}-{e}/{t}",  # another start
        lambda s, e, t: f"bytes {s}-{e + 5}/{t + 5}",  # another size
        lambda s, e, t: f"bytes {s}-{e}/*",  # no size
        lambda s, e, t: f"bytes {s}-{e - 1}/{t}",  # not to the end
        lambda s, e, t: "pages 1-2/3",
    ],
    ids=["start", "total", "unknown total", "end", "garbage"],
)
def test_a_wrong_content_range_restarts(server, final, content_range):
    cut_transfer(server, final, 100_000)
    server.content_range = content_range
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(0))
    assert [request[:1] for request in server.log] == [(None,), ("bytes=100000-",), (None,)]


def test_a_server_that_ignores_if_range_is_caught_by_the_changed_etag(server, final):
    """A server (or cache) that applies Range whatever If-Range says, but states the ETag of
    what it sends: the changed ETag of the 206 starts the file again from byte 0."""
    cut_transfer(server, final, 100_000)
    server.files[PATH] = payload(1)
    server.ranges = "always"
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(1))
    assert [status for *_, status in server.log] == [200, 206, 200]


def test_a_part_from_another_url_starts_again(server, final):
    cut_transfer(server, final, 100_000)
    server.files["/other/data.bin"] = payload(1)
    other = server.url.replace(PATH, "/other/data.bin")
    fetch(other, final, progress=False, retries=0, limits=FAST)
    assert sha256(final.read_bytes()) == sha256(payload(1))
    assert server.log[-1] == (None, None, 200)


def test_the_validator_survives_the_process(server, final):
    """A transfer cut in one process and resumed in another: the second sends the first's
    ETag in If-Range and gets the rest (206); a file changed meanwhile arrives whole."""
    final.parent.mkdir(parents=True)
    argv = [sys.executable, "-c", FETCH_IN_ANOTHER_PROCESS, str(ROOT / "spacy_elmo" / "util")]
    argv += [server.url, str(final)]
    server.cuts = [100_000]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "DownloadError: transfer of" in first.stdout and "after 100000 of" in first.stdout, first
    assert json.loads(state_path(final).read_text())["validator"] == etag(payload(0))
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and second.stdout == "", second
    assert sha256(final.read_bytes()) == sha256(payload(0))
    assert server.log[-1] == ("bytes=100000-", etag(payload(0)), 206)
    # Again, with the file changed between the two processes (into another folder: the
    # record of the first would refuse the new file).
    argv[-1] = str(final.parent.parent / "again" / final.name)
    final = Path(argv[-1])
    final.parent.mkdir()
    server.cuts = [50_000]
    subprocess.run(argv, capture_output=True, text=True, timeout=120)
    server.files[PATH] = payload(1)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and second.stdout == "", second
    assert sha256(final.read_bytes()) == sha256(payload(1))
    assert server.log[-1] == ("bytes=50000-", etag(payload(0)), 200)


# ------------------------------------------------------------------------ no crawl
def test_a_slow_drip_ends_after_the_speed_time_and_keeps_its_part(server, final, monkeypatch):
    """8 bytes every 0.1 s (80 bytes/s) against 1024 bytes/s over 1 s: the transfer ends in
    about a second (never: the stall timeout of 10 s does not fire while bytes trickle)."""
    final.parent.mkdir(parents=True)
    server.drip = (8, 0.1)
    monkeypatch.setenv(SPEED_LIMIT_VARIABLE, "1024")
    monkeypatch.setenv(SPEED_TIME_VARIABLE, "1")
    monkeypatch.setenv(TIMEOUT_VARIABLE, "10")
    limits = Limits.configured()
    assert limits == Limits(timeout=10, speed_limit=1024, speed_time=1)
    started = time.monotonic()
    with pytest.raises(DownloadError) as raised:
        fetch(
            server.url,
            final,
            progress=False,
            limits=limits,
            command="fetch-it",
        )
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith(f"transfer of {server.url} is too slow: ")
    rate = float(message.split("too slow: ")[1].split(" bytes/s")[0])
    assert 0 < rate < 1024
    for setting in (SPEED_LIMIT_VARIABLE, "--speed-limit", SPEED_TIME_VARIABLE, "--speed-time"):
        assert setting in message
    assert "below 1024 bytes/s" in message and "for 1 s" in message
    assert "run `fetch-it` again" in message and f"{part_path(final)} keeps what arrived" in message
    assert elapsed < 8, elapsed  # bounded by the speed time, not by the 10 s stall timeout
    assert len(server.log) == 1  # a crawl is not retried
    kept = part_path(final).read_bytes()
    assert kept and kept == payload(0)[: len(kept)] and state_path(final).exists()
    server.drip = None
    fetch(server.url, final, progress=False, limits=limits)
    assert sha256(final.read_bytes()) == sha256(payload(0))
    assert server.log[-1] == (f"bytes={len(kept)}-", etag(payload(0)), 206)


def test_a_speed_limit_of_0_turns_the_check_off(server, final):
    final.parent.mkdir(parents=True)
    server.drip = (SIZE // 4, 0.4)  # about 0.6 MB/s, in bursts 0.4 s apart
    fetch(server.url, final, progress=False, limits=Limits(10, 0, 0.1))
    assert sha256(final.read_bytes()) == sha256(payload(0))


@pytest.mark.parametrize(
    "variable, value, message",
    [
        (
            SPEED_LIMIT_VARIABLE,
            "-1",
            "SPACY_ELMO_DOWNLOAD_SPEED_LIMIT='-1' is not a positive number or 0",
        ),
        (SPEED_LIMIT_VARIABLE, "fast", "SPACY_ELMO_DOWNLOAD_SPEED_LIMIT='fast' is not"),
        (SPEED_TIME_VARIABLE, "0", "SPACY_ELMO_DOWNLOAD_SPEED_TIME='0' is not a positive"),
        (SPEED_TIME_VARIABLE, "inf", "SPACY_ELMO_DOWNLOAD_SPEED_TIME='inf' is not a positive"),
        (TIMEOUT_VARIABLE, "-3", "SPACY_ELMO_DOWNLOAD_TIMEOUT='-3' is not a positive"),
    ],
)
def test_bad_limits_are_named(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=message):
        Limits.configured()


def test_limits_given_override_the_environment(monkeypatch):
    monkeypatch.setenv(SPEED_LIMIT_VARIABLE, "5")
    assert Limits.configured(speed_limit=7).speed_limit == 7
    assert Limits.configured().speed_limit == 5
    with pytest.raises(ValueError, match=r"--speed-time -1 \(SPACY_ELMO_DOWNLOAD_SPEED_TIME\)"):
        Limits.configured(speed_time=-1)


# ------------------------------------------------------------------------ checks and install
def test_a_part_that_fails_its_check_is_deleted_with_its_validator(server, final):
    final.parent.mkdir(parents=True)
    with pytest.raises(DownloadError, match=r"is not it; the download was deleted"):
        fetch(server.url, final, lambda part: "is not it", progress=False, limits=FAST)
    assert sorted(os.listdir(final.parent)) == ["data.bin.lock"]
    fetch(server.url, final, lambda part: None, progress=False, limits=FAST)
    assert sorted(os.listdir(final.parent)) == ["checksums.json", "data.bin", "data.bin.lock"]
    record = json.loads((final.parent / "checksums.json").read_text())["files"]["data.bin"]
    assert (record["size"], record["sha256"]) == (SIZE + 3, sha256(payload(0)))


# ------------------------------------------------------------------------ never through a link
@pytest.mark.parametrize("link", ["symbolic", "hard"])
@pytest.mark.parametrize("recorded", [False, True], ids=["no-record", "record-of-the-url"])
def test_a_link_at_the_part_is_never_written_through(server, final, tmp_path, link, recorded):
    """A link planted at `<file>.part` (to a file of the user's), with or without a record
    beside it that names the URL: the file it names keeps its bytes, and what is installed is
    a regular file of its own holding the bytes served."""
    victim = tmp_path / "precious.bin"
    victim.write_bytes(b"the user's own data\n" * 100)
    before = victim.read_bytes()
    final.parent.mkdir(parents=True)
    if link == "symbolic":
        part_path(final).symlink_to(victim)
    else:
        os.link(victim, part_path(final))
    if recorded:  # as a cut transfer of this URL would leave it
        state = {"url": server.url, "kind": "etag", "validator": etag(payload(0)), "size": SIZE + 3}
        state_path(final).write_text(json.dumps(state))
    fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert victim.read_bytes() == before
    assert final.is_file() and not final.is_symlink() and final.stat().st_nlink == 1
    assert sha256(final.read_bytes()) == sha256(payload(0))
    assert [request[:2] for request in server.log] == [(None, None)]  # from byte 0


# ------------------------------------------------------------------------ what an error says
def test_a_cut_part_that_cannot_be_resumed_is_not_said_to_be_kept(server, final):
    """Without a strong validator the part is deleted: the error says nothing is kept."""
    server.validators = "weak"
    final.parent.mkdir(parents=True)
    server.cuts = [100_000]
    with pytest.raises(DownloadError, match=r"was cut .* after 100000 of") as raised:
        fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert "keeps what arrived" not in str(raised.value)
    assert not part_path(final).exists() and not state_path(final).exists()
    server.validators = "etag"  # the same cut with a validator keeps the part, and says so
    server.cuts = [100_000]
    with pytest.raises(DownloadError, match=r"was cut .* after 100000 of") as raised:
        fetch(server.url, final, progress=False, retries=0, limits=FAST)
    assert f"({part_path(final)} keeps what arrived)" in str(raised.value)
    assert part_path(final).stat().st_size == 100_000
