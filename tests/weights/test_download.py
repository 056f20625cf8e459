"""`spacy-elmo download` and the published names, against an HTTP server on 127.0.0.1.

The server holds files in the published layout of `small`: its options file as AllenNLP
publishes it and a weights file with every dataset of its architecture (spec §2, §12), the
small ones random and the large ones left to HDF5's fill value, so that the file is small. It
can cut a transfer, ignore Range, omit or misstate Content-Length, stall, and change a file;
it sends a strong ETag (or a Last-Modified, a weak ETag, or no validator) and answers a Range
with If-Range as RFC 9110 says: the rest of the file only while the validator still matches.
Every download goes to `SPACY_ELMO_CACHE` = a temporary folder, from `SPACY_ELMO_MIRROR`.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import socket
import threading
import time
from email.utils import formatdate
from pathlib import Path

import h5py
import numpy
import pytest
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.cli import app
from spacy_elmo.description.options import BiLMOptions
from spacy_elmo.util.download import RECORD_NAME
from spacy_elmo.util.json_files import MissingFileError
from spacy_elmo.weights import published
from spacy_elmo.weights.published import ChecksumError, DownloadError, download
from spacy_elmo.weights.sources import resolve_source

from ..bilm.util import same_weights

SMALL = published.PUBLISHED["small"]
WORDS = [["The", "river", "bank", "."], ["ok"]]
# The published options of `small` (spec §12), written here as the published file states them.
SMALL_OPTIONS = {
    "lstm": {
        "use_skip_connections": True,
        "projection_dim": 128,
        "cell_clip": 3,
        "proj_clip": 3,
        "dim": 1024,
        "n_layers": 2,
    },
    "char_cnn": {
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 1,
        "embedding": {"dim": 16},
        "n_characters": 262,
        "max_characters_per_token": 50,
    },
}
WRITTEN_VALUES = 100_000  # datasets up to this size get random values, larger ones fill values


def small_datasets() -> dict[str, tuple[int, ...]]:
    """Every dataset of `small`'s weights file and its shape, from spec §2's table."""
    e, f, p, d = 16, 2048, 128, 1024
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (261, e)}
    for k, (width, n) in enumerate(SMALL_OPTIONS["char_cnn"]["filters"]):
        shapes[f"CNN/W_cnn_{k}"], shapes[f"CNN/b_cnn_{k}"] = (1, width, e, n), (n,)
    for kind in ("transform", "carry"):
        shapes[f"CNN_high_0/W_{kind}"], shapes[f"CNN_high_0/b_{kind}"] = (f, f), (f,)
    shapes["CNN_proj/W_proj"], shapes["CNN_proj/b_proj"] = (f, p), (p,)
    for direction in range(2):
        for layer in range(2):
            cell = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            shapes[f"{cell}/W_0"], shapes[f"{cell}/B"] = (2 * p, 4 * d), (4 * d,)
            shapes[f"{cell}/W_P_0"] = (d, p)
    return shapes


def write_small_weights(path: Path, seed: int = 0, skip: str = "", shapes=None) -> bytes:
    """A weights file in `small`'s layout (`skip`: a dataset left out); its bytes."""
    rng = numpy.random.default_rng(seed)
    with h5py.File(path, "w") as hdf5:
        for name, shape in (shapes or small_datasets()).items():
            if name == skip:
                continue
            if numpy.prod(shape) <= WRITTEN_VALUES:
                hdf5.create_dataset(name, data=rng.standard_normal(shape).astype("float32"))
            else:  # not written: HDF5 allocates nothing and reads zeros
                hdf5.create_dataset(name, shape=shape, dtype="float32")
    return path.read_bytes()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The published `small` files (options.json, weights.hdf5) and a second, different but
    whole weights file (weights_1.hdf5)."""
    folder = tmp_path_factory.mktemp("small")
    (folder / "options.json").write_text(json.dumps(SMALL_OPTIONS), encoding="utf-8")
    write_small_weights(folder / "weights.hdf5", seed=0)
    write_small_weights(folder / "weights_1.hdf5", seed=1)
    return folder


@pytest.fixture
def fixture_files(source) -> dict[str, bytes]:
    return {
        "options": (source / "options.json").read_bytes(),
        "weights": (source / "weights.hdf5").read_bytes(),
        "weights_1": (source / "weights_1.hdf5").read_bytes(),
    }


class Mirror(http.server.ThreadingHTTPServer):
    """A static file server with Range support and faults on demand."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.if_ranges: list[str | None] = []  # the If-Range header of each request
        self.validators = "etag"  # or "last-modified", "weak" (a weak ETag), "none"
        self.cuts: dict[str, list[int]] = {}  # path -> bytes sent by each next response
        self.ignore_range = False
        self.no_length: set[str] = set()  # paths sent without Content-Length
        self.announced: dict[str, int] = {}  # path -> the Content-Length stated instead
        # path -> (bytes sent, then the response waits for the event before the rest)
        self.stalls: dict[str, tuple[int, threading.Event]] = {}
        self.drips: dict[str, tuple[int, float]] = {}  # path -> (bytes, seconds) at a time
        self.closing = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def ranges(self, file_name: str) -> list[str | None]:
        return [rng for path, rng in self.requests if path.endswith("/" + file_name)]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Mirror

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        mirror = self.server
        mirror.requests.append((self.path, self.headers.get("Range")))
        mirror.if_ranges.append(self.headers.get("If-Range"))
        data = mirror.files.get(self.path)
        if data is None:
            self.send_error(404, "Not Found")
            return
        digest = hashlib.sha256(data).hexdigest()
        validators = {  # a Last-Modified of 2001 or later, another for another file
            "etag": ("ETag", f'"{digest[:16]}"'),
            "weak": ("ETag", f'W/"{digest[:16]}"'),
            "last-modified": ("Last-Modified", formatdate(1e9 + int(digest[:6], 16), usegmt=True)),
        }
        validator = validators.get(mirror.validators)
        start, status = 0, 200
        requested = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if if_range is not None and (validator is None or if_range != validator[1]):
            requested = None  # the file changed (or cannot be compared): the whole file
        if requested and not mirror.ignore_range:
            start = int(requested.removeprefix("bytes=").rstrip("-"))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:]
        self.send_response(status)
        if validator is not None:
            self.send_header(*validator)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if self.path not in mirror.no_length:
            self.send_header("Content-Length", str(mirror.announced.get(self.path, len(body))))
        self.end_headers()
        self.close_connection = True
        cuts = mirror.cuts.get(self.path)
        if cuts:
            self.wfile.write(body[: cuts.pop(0)])  # then the connection closes
            return
        drip = mirror.drips.get(self.path)
        for at in range(0, len(body), drip[0]) if drip else ():
            if mirror.closing.wait(drip[1]):
                return
            try:
                self.wfile.write(body[at : at + drip[0]])
                self.wfile.flush()
            except OSError:  # the client hung up
                return
        if drip:
            return
        stall = mirror.stalls.pop(self.path, None)
        if stall:
            sent, release = stall
            self.wfile.write(body[:sent])
            self.wfile.flush()
            release.wait(30)
            body = body[sent:]
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def mirror(fixture_files, tmp_path, monkeypatch):
    """The server, with `small`, as SPACY_ELMO_MIRROR, and an empty SPACY_ELMO_CACHE."""
    server = Mirror()
    server.files[f"/{SMALL.shape}/{SMALL.options_name}"] = fixture_files["options"]
    server.files[f"/{SMALL.shape}/{SMALL.weights_name}"] = fixture_files["weights"]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("SPACY_ELMO_MIRROR", server.url + "/")
    monkeypatch.setenv("SPACY_ELMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPACY_ELMO_DOWNLOAD_TIMEOUT", raising=False)
    yield server
    server.closing.set()
    for _, release in server.stalls.values():
        release.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def weights_path(mirror: Mirror, model=SMALL) -> str:
    return f"/{model.shape}/{model.weights_name}"


def options_path(model=SMALL) -> str:
    return f"/{model.shape}/{model.options_name}"


def cached(model=SMALL) -> Path:
    return published.cache_dir() / model.shape


def record(model=SMALL) -> dict:
    path = cached(model) / RECORD_NAME
    return json.loads(path.read_text())["files"] if path.exists() else {}


def reference(source: Path) -> BiLM:
    return BiLM.from_allennlp(source / "options.json", source / "weights.hdf5")


# ------------------------------------------------------------------------ a whole download
def test_download_then_load_by_name(mirror, fixture_files, source):
    options, weights = download("small", progress=False)
    assert options.read_bytes() == fixture_files["options"]
    assert weights.read_bytes() == fixture_files["weights"]
    assert sorted(p.name for p in cached().iterdir() if p.suffix != ".lock") == sorted(
        [SMALL.options_name, SMALL.weights_name, RECORD_NAME]
    )
    record = json.loads((cached() / RECORD_NAME).read_text())["files"]
    for name, key in ((SMALL.options_name, "options"), (SMALL.weights_name, "weights")):
        assert record[name]["size"] == len(fixture_files[key])
        assert record[name]["sha256"] == hashlib.sha256(fixture_files[key]).hexdigest()
    assert mirror.ranges(SMALL.weights_name) == [None]
    found = resolve_source("small")
    assert (found.kind, found.options_file, found.weights_file) == ("allennlp", options, weights)
    same_weights(BiLM.load("small"), reference(source))
    # Again: verified against the record, not fetched.
    download("small", progress=False)
    assert len(mirror.ranges(SMALL.weights_name)) == 1


def test_download_command_and_embed_by_name(mirror, source, tmp_path):
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 0, result.output
    assert "small: downloaded" in result.output and "--model small" in result.output
    result = CliRunner().invoke(app, ["download", "small"])
    assert result.exit_code == 0, result.output
    assert "small: already downloaded, verified against" in result.output
    text = tmp_path / "in.txt"
    text.write_text("\n".join(" ".join(words) for words in WORDS) + "\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result = CliRunner().invoke(app, ["embed", str(text), str(out), "--model", "small", "-q"])
    assert result.exit_code == 0, result.output
    expected = reference(source).embed(WORDS)
    with h5py.File(out) as written:
        for index, vectors in enumerate(expected):
            numpy.testing.assert_allclose(written[str(index)][()], vectors, atol=1e-5, rtol=0)


def test_a_name_not_downloaded_is_not_fetched_by_the_resolver(mirror):
    with pytest.raises(MissingFileError, match=r"run `spacy-elmo download small`"):
        resolve_source("small")
    result = CliRunner().invoke(app, ["embed", "x.txt", "o.hdf5", "--model", "original"])
    assert result.exit_code == 1 and "spacy-elmo download original" in result.stderr
    assert mirror.requests == []


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown published biLM 'large'.*small, medium"):
        download("large")
    result = CliRunner().invoke(app, ["download", "large"])
    assert result.exit_code == 1 and result.stderr.startswith("error: unknown published biLM")


# ------------------------------------------------------------------------ a cut transfer
def test_cut_transfer_resumes_with_range_on_the_next_run(mirror, fixture_files):
    half = len(fixture_files["weights"]) // 2
    mirror.cuts[weights_path(mirror)] = [half]
    with pytest.raises(
        DownloadError, match=rf"cut .* after {half} of {len(fixture_files['weights'])}"
    ):
        download("small", progress=False, retries=0)
    final = cached() / SMALL.weights_name
    part = final.with_name(final.name + ".part")
    assert not final.exists()  # nothing under the final name until whole
    assert part.read_bytes() == fixture_files["weights"][:half]
    with pytest.raises(MissingFileError):
        resolve_source("small")
    download("small", progress=False, retries=0)
    assert mirror.ranges(SMALL.weights_name) == [None, f"bytes={half}-"]
    assert final.read_bytes() == fixture_files["weights"] and not part.exists()


def cut_once(mirror: Mirror, fixture_files, at: int) -> Path:
    """A download of the weights cut after `at` bytes: its part (and the validator beside it)."""
    mirror.cuts[weights_path(mirror)] = [at]
    with pytest.raises(DownloadError, match=rf"cut .* after {at} of"):
        download("small", progress=False, retries=0)
    return cached() / (SMALL.weights_name + ".part")


def test_server_ignoring_range_restarts_cleanly(mirror, fixture_files):
    part = cut_once(mirror, fixture_files, 1000)
    mirror.ignore_range = True
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name) == [None, "bytes=1000-"]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]
    assert not part.exists() and not part.with_suffix(".part.json").exists()


def test_part_longer_than_the_file_restarts_cleanly(mirror, fixture_files):
    size = len(fixture_files["weights"])
    part = cut_once(mirror, fixture_files, 1000)
    part.write_bytes(b"x" * (size + 10))
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name) == [None, f"bytes={size + 10}-", None]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_a_file_changed_between_a_cut_and_its_resume_ends_as_the_new_file(
    mirror, fixture_files, tmp_path
):
    """The published file is replaced by another of the same size and layout after a cut: the
    resume asks for the rest only of the file it holds the start of (If-Range), the server
    sends the new file whole, and the new file is installed, never the old head and the new
    tail (which would pass every check of the format)."""
    old, new = fixture_files["weights"], fixture_files["weights_1"]
    half = len(old) // 2
    mixed = tmp_path / SMALL.weights_name
    mixed.write_bytes(old[:half] + new[half:])
    assert len(old) == len(new) and old[:half] != new[:half]
    assert published._format_problem(SMALL, mixed) is None  # the checks cannot tell
    cut_once(mirror, fixture_files, half)
    mirror.files[weights_path(mirror)] = new
    download("small", progress=False, retries=0)
    final = cached() / SMALL.weights_name
    assert hashlib.sha256(final.read_bytes()).hexdigest() == hashlib.sha256(new).hexdigest()
    assert record()[SMALL.weights_name]["sha256"] == hashlib.sha256(new).hexdigest()
    assert mirror.ranges(SMALL.weights_name) == [None, f"bytes={half}-"]
    assert mirror.if_ranges[-1] == f'"{hashlib.sha256(old).hexdigest()[:16]}"'  # old's ETag


@pytest.mark.parametrize("validators", ["last-modified", "weak", "none"])
def test_a_resume_needs_a_strong_validator(mirror, fixture_files, validators):
    """A Last-Modified (well before the answer's Date) is one; a weak ETag or none is not: the
    part starts again from byte 0, and a changed file still ends whole."""
    mirror.validators = validators
    part = cut_once(mirror, fixture_files, 1000)
    mirror.files[weights_path(mirror)] = fixture_files["weights_1"]
    download("small", progress=False, retries=0)
    resumed = validators == "last-modified"
    assert mirror.ranges(SMALL.weights_name) == [None, "bytes=1000-" if resumed else None]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights_1"]
    assert not part.exists()


def test_a_second_download_of_the_same_file_stops(mirror):
    from filelock import FileLock

    cached().mkdir(parents=True)
    part = cached() / (SMALL.options_name + ".part")
    with FileLock(cached() / (SMALL.options_name + ".lock")):  # another download's lock
        with pytest.raises(DownloadError, match=f"another download is writing {part}"):
            download("small", progress=False)
    assert mirror.requests == []


# ------------------------------------------------------------------------ checksums
def test_a_changed_file_on_the_server_is_refused_and_force_replaces_the_record(
    mirror, fixture_files
):
    download("small", progress=False)
    final = cached() / SMALL.weights_name
    final.unlink()  # the record stays
    mirror.files[weights_path(mirror)] = fixture_files["weights_1"]  # whole, but another file
    expected = hashlib.sha256(fixture_files["weights"]).hexdigest()
    got = hashlib.sha256(fixture_files["weights_1"]).hexdigest()
    with pytest.raises(ChecksumError, match=rf"expected .* sha256 {expected}; got .* {got}"):
        download("small", progress=False)
    assert not final.exists()
    assert not final.with_name(final.name + ".part").exists()  # the refused copy is deleted
    assert record()[SMALL.weights_name]["sha256"] == expected
    # --force: checked whole, then it replaces the file and the record
    result = CliRunner().invoke(app, ["download", "small", "--force", "-q"])
    assert result.exit_code == 0, result.output
    assert final.read_bytes() == fixture_files["weights_1"]
    assert record()[SMALL.weights_name]["sha256"] == got
    assert record()[SMALL.weights_name]["size"] == len(fixture_files["weights_1"])


def test_a_cached_file_that_changed_is_found(mirror, fixture_files):
    download("small", progress=False)
    final = cached() / SMALL.weights_name
    changed = bytearray(fixture_files["weights"])
    changed[100] ^= 0xFF
    final.write_bytes(bytes(changed))
    with pytest.raises(ChecksumError, match="changed since it was downloaded"):
        download("small", progress=False)
    download("small", force=True, progress=False)  # verified against the record again
    assert final.read_bytes() == fixture_files["weights"]
    final.write_bytes(fixture_files["weights"][:-1])  # a size change: found without hashing
    with pytest.raises(ChecksumError, match=r"spacy-elmo download small --force"):
        resolve_source("small")


def test_an_error_page_instead_of_the_file_is_refused(mirror):
    mirror.files[weights_path(mirror)] = b"<html>proxy login</html>"
    with pytest.raises(DownloadError, match="did not send an HDF5 file"):
        download("small", progress=False)
    assert not (cached() / SMALL.weights_name).exists()
    assert not (cached() / (SMALL.weights_name + ".part")).exists()


# ------------------------------------------------------------------------ verified whole
def assert_nothing_installed() -> None:
    assert not (cached() / SMALL.weights_name).exists()
    assert not (cached() / (SMALL.weights_name + ".part")).exists()
    assert SMALL.weights_name not in record()


def test_a_transfer_cut_short_without_content_length_is_refused(mirror, fixture_files):
    """No Content-Length: the connection closing is the only end the client sees."""
    path = weights_path(mirror)
    mirror.no_length.add(path)
    mirror.cuts[path] = [len(fixture_files["weights"]) * 2 // 3]
    with pytest.raises(DownloadError, match=r"is not a whole weights file of .*'small'.*deleted"):
        download("small", progress=False)
    assert_nothing_installed()
    result = CliRunner().invoke(app, ["download", "small", "-q"])  # the server is whole again
    assert result.exit_code == 0, result.output
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]
    digest = hashlib.sha256(fixture_files["weights"]).hexdigest()
    assert record()[SMALL.weights_name]["sha256"] == digest


def test_a_content_length_smaller_than_the_file_is_refused(mirror, fixture_files):
    mirror.announced[weights_path(mirror)] = len(fixture_files["weights"]) - 4096
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1 and "not a whole weights file" in result.stderr, result.output
    assert "downloaded" not in result.stdout
    assert_nothing_installed()


def test_garbage_after_an_hdf5_signature_is_refused(mirror, fixture_files):
    garbage = numpy.random.default_rng(3).bytes(len(fixture_files["weights"]) - 8)
    mirror.files[weights_path(mirror)] = published.HDF5_SIGNATURE + garbage
    with pytest.raises(DownloadError, match=r"cannot read .* as HDF5 .*; the download was deleted"):
        download("small", progress=False)
    assert_nothing_installed()


@pytest.mark.parametrize(
    "change, message",
    [
        ("missing", r"has no dataset 'CNN_high_0/W_carry'"),
        ("shape", r"dataset 'CNN_proj/b_proj' has shape \(64,\) but .*'small' implies \(128,\)"),
        ("extra", r"has datasets that .*'small' does not describe: CNN_high_1/b_carry"),
        ("integers", r"'CNN/b_cnn_0' has integer dtype int32"),
        ("nan", r"'char_embed' contains NaN or inf"),
    ],
)
def test_weights_of_another_architecture_or_damaged_are_refused(mirror, tmp_path, change, message):
    shapes = small_datasets()
    weights = tmp_path / "bad.hdf5"
    if change == "shape":
        shapes["CNN_proj/b_proj"] = (64,)
    elif change == "extra":
        shapes["CNN_high_1/b_carry"] = (2048,)
    write_small_weights(
        weights, skip="CNN_high_0/W_carry" if change == "missing" else "", shapes=shapes
    )
    if change in ("integers", "nan"):
        with h5py.File(weights, "r+") as hdf5:
            if change == "integers":
                del hdf5["CNN/b_cnn_0"]
                hdf5.create_dataset("CNN/b_cnn_0", data=numpy.zeros(32, "int32"))
            else:
                hdf5["char_embed"][5, 3] = numpy.nan
    mirror.files[weights_path(mirror)] = weights.read_bytes()
    with pytest.raises(DownloadError, match=message):
        download("small", progress=False)
    assert_nothing_installed()


def test_files_of_another_biLM_served_under_the_name_are_refused(mirror, allennlp_fixture):
    """The AllenNLP test biLM (dim 64, 5 filters) served as `small`."""
    mirror.files[options_path()] = (allennlp_fixture / "options.json").read_bytes()
    with pytest.raises(
        DownloadError, match=r"options file of another biLM than the published 'small': .*filters"
    ):
        download("small", progress=False)
    assert not (cached() / SMALL.options_name).exists() and record() == {}
    mirror.files[options_path()] = json.dumps(SMALL_OPTIONS).encode()
    mirror.files[weights_path(mirror)] = (allennlp_fixture / "lm_weights.hdf5").read_bytes()
    with pytest.raises(DownloadError, match=r"not a whole weights file of the published 'small'"):
        download("small", progress=False)
    assert_nothing_installed()


def test_a_bad_copy_in_the_cache_is_found_and_force_replaces_it(mirror, fixture_files):
    """A bad weights file in the cache with a record of it (as an earlier version could make):
    `download` refuses it, `--force` downloads, checks and records the good copy."""
    folder = cached()
    folder.mkdir(parents=True)
    bad = published.HDF5_SIGNATURE + b"\0" * 5000
    (folder / SMALL.options_name).write_bytes(fixture_files["options"])
    (folder / SMALL.weights_name).write_bytes(bad)
    entry = {"size": len(bad), "sha256": hashlib.sha256(bad).hexdigest()}
    (folder / RECORD_NAME).write_text(json.dumps({"files": {SMALL.weights_name: entry}}))
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1, result.output
    assert "not a whole weights file" in result.stderr and "--force" in result.stderr
    result = CliRunner().invoke(app, ["download", "small", "--force", "-q"])
    assert result.exit_code == 0, result.output
    assert (folder / SMALL.weights_name).read_bytes() == fixture_files["weights"]
    digest = hashlib.sha256(fixture_files["weights"]).hexdigest()
    assert record()[SMALL.weights_name]["sha256"] == digest
    assert CliRunner().invoke(app, ["download", "small", "-q"]).exit_code == 0


def test_a_whole_file_found_in_the_cache_without_a_record_is_checked_before_recording(
    mirror, fixture_files
):
    folder = cached()
    folder.mkdir(parents=True)
    (folder / SMALL.options_name).write_bytes(fixture_files["options"])
    (folder / SMALL.weights_name).write_bytes(fixture_files["weights"][:-100])
    with pytest.raises(ChecksumError, match=r"cached file .* is not a whole weights file"):
        download("small", progress=False)
    assert SMALL.weights_name not in record()
    (folder / SMALL.weights_name).write_bytes(fixture_files["weights"])
    download("small", progress=False)
    assert record()[SMALL.weights_name]["source"] == "found in the cache"
    assert mirror.requests == []


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", r"Unexpected character|Expected"),
        ("[]", r"list indices"),
        ('{"files": []}', r"has no attribute 'items'"),
        ('{"files": {"w.hdf5": "abc"}}', r"the entry of w.hdf5 is 'abc'"),
        ('{"files": {"w.hdf5": {"size": "12", "sha256": "00"}}}', r"w.hdf5 is \{'size': '12'"),
        (
            '{"files": {"w.hdf5": {"size": 12, "sha256": 7}}}',
            r"w.hdf5 is \{'size': 12, 'sha256': 7",
        ),
        (b"\xff\xfe".decode("latin-1"), r"can't decode|codec"),
    ],
)
def test_a_malformed_record_is_an_error_naming_it(mirror, fixture_files, text, reason):
    folder = cached()
    folder.mkdir(parents=True)
    path = folder / RECORD_NAME
    path.write_bytes(text.encode("latin-1"))
    form = re.escape('{"files": {name: {"size": bytes, "sha256": hex digest}}}')
    pattern = rf"checksum record {path} is not {form} \(.*({reason})"
    with pytest.raises(ChecksumError, match=pattern):
        download("small", progress=False)
    assert mirror.requests == []
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1 and result.stderr.startswith(f"error: checksum record {path}")
    assert "internal error" not in result.stderr
    for name in ("options", "weights"):  # the files are there: the resolver reads the record
        (folder / getattr(SMALL, f"{name}_name")).write_bytes(fixture_files[name])
    with pytest.raises(ChecksumError, match=pattern):
        resolve_source("small")
    result = CliRunner().invoke(app, ["download", "small", "--force", "-q"])
    assert result.exit_code == 0, result.output
    assert set(record()) == {SMALL.options_name, SMALL.weights_name}


# ------------------------------------------------------------------------ stalls and progress
def test_a_stalled_transfer_ends_after_the_timeout_and_keeps_its_part(mirror, fixture_files):
    size = len(fixture_files["weights"])
    release = threading.Event()
    mirror.stalls[weights_path(mirror)] = (size // 2, release)
    started = time.monotonic()
    with pytest.raises(
        DownloadError,
        match=rf"stalled: nothing arrived for 0.5 s \(SPACY_ELMO_DOWNLOAD_TIMEOUT\) after "
        rf"{size // 2} of {size} bytes",
    ):
        download("small", progress=False, timeout=0.5)
    assert time.monotonic() - started < 10
    release.set()
    part = cached() / (SMALL.weights_name + ".part")
    assert part.read_bytes() == fixture_files["weights"][: size // 2]
    assert len(mirror.ranges(SMALL.weights_name)) == 1  # a stall is not retried
    download("small", progress=False)  # resumed
    assert mirror.ranges(SMALL.weights_name)[-1] == f"bytes={size // 2}-"
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_the_stall_timeout_comes_from_the_environment(mirror, monkeypatch):
    monkeypatch.setenv("SPACY_ELMO_DOWNLOAD_TIMEOUT", "0.3")
    release = threading.Event()
    mirror.stalls[options_path()] = (0, release)  # the headers, then nothing
    started = time.monotonic()
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    release.set()
    assert result.exit_code == 1 and "nothing arrived for 0.3 s" in result.stderr, result.output
    assert time.monotonic() - started < 10
    assert not (cached() / (SMALL.options_name + ".part")).exists()  # nothing arrived
    for bad in ("0", "-2", "never", "inf"):
        monkeypatch.setenv("SPACY_ELMO_DOWNLOAD_TIMEOUT", bad)
        result = CliRunner().invoke(app, ["download", "small", "-q"])
        assert result.exit_code == 1, result.output
        assert f"SPACY_ELMO_DOWNLOAD_TIMEOUT='{bad}' is not a positive" in result.stderr


def test_a_server_that_accepts_but_never_answers_ends_after_the_timeout(mirror, monkeypatch):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        monkeypatch.setenv("SPACY_ELMO_MIRROR", f"http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(
            DownloadError, match=r"no answer within 0.4 s, SPACY_ELMO_DOWNLOAD_TIMEOUT"
        ):
            download("small", progress=False, timeout=0.4)
        assert time.monotonic() - started < 10


def test_a_crawling_transfer_ends_after_the_speed_time(mirror, fixture_files):
    """16 bytes every 0.1 s never stalls; `--speed-limit 1024 --speed-time 1` ends it in about
    a second, naming the URL, the rate and both settings; the next run resumes the part."""
    mirror.drips[weights_path(mirror)] = (16, 0.1)
    started = time.monotonic()
    argv = ["download", "small", "-q", "--speed-limit", "1024", "--speed-time", "1"]
    result = CliRunner().invoke(app, argv)
    assert time.monotonic() - started < 10
    assert result.exit_code == 1, result.output
    url = f"{mirror.url}/{SMALL.shape}/{SMALL.weights_name}"
    assert re.search(
        rf"^error: transfer of {re.escape(url)} is too slow: [\d.]+ bytes/s over the last "
        r"1\.\d s, below 1024 bytes/s \(SPACY_ELMO_DOWNLOAD_SPEED_LIMIT or --speed-limit; .*"
        r"for 1 s \(SPACY_ELMO_DOWNLOAD_SPEED_TIME or --speed-time\), after \d+ of "
        rf"{len(fixture_files['weights'])} bytes; run `spacy-elmo download small` again",
        result.stderr,
    ), result.stderr
    kept = (cached() / (SMALL.weights_name + ".part")).read_bytes()
    assert kept and kept == fixture_files["weights"][: len(kept)]
    del mirror.drips[weights_path(mirror)]
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name)[-1] == f"bytes={len(kept)}-"
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_the_part_grows_as_bytes_arrive(mirror, fixture_files):
    size = len(fixture_files["weights"])
    release = threading.Event()
    mirror.stalls[weights_path(mirror)] = (3000, release)
    part = cached() / (SMALL.weights_name + ".part")
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(download("small", progress=False))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            outcome.append(error)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size == 3000):
        time.sleep(0.02)
    grown = part.stat().st_size if part.exists() else 0
    release.set()
    worker.join(30)
    assert grown == 3000, "the part did not hold the first 3000 bytes while the rest waited"
    assert not isinstance(outcome[0], Exception), outcome
    assert (cached() / SMALL.weights_name).stat().st_size == size


# ------------------------------------------------------------------------ mirrors
@pytest.mark.parametrize(
    "mirror_value", ["{tmp}/mirror", "file://{tmp}/mirror", "s3://bucket/elmo"]
)
def test_a_mirror_that_is_not_an_http_url_is_named(tmp_path, monkeypatch, mirror_value):
    mirror_value = mirror_value.format(tmp=tmp_path)
    monkeypatch.setenv("SPACY_ELMO_MIRROR", mirror_value)
    monkeypatch.setenv("SPACY_ELMO_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    expected = f"SPACY_ELMO_MIRROR={mirror_value!r} is not an http:// or https:// URL"
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "cache").exists()


def test_every_published_name_has_its_architecture():
    """Parameter counts of spec §12 (13.6M / 28.0M / 93.6M on the AllenNLP ELMo page)."""
    counts = {
        name: model.architecture.n_parameters() for name, model in published.PUBLISHED.items()
    }
    assert counts == {
        "small": 13_593_296,
        "medium": 28_027_728,
        "original": 93_600_848,
        "original-5.5b": 93_600_848,
    }
    assert published.PUBLISHED["small"].architecture == BiLMOptions.from_dict(SMALL_OPTIONS)


# ------------------------------------------------------------------------ other failures
def test_404_names_the_url_and_status(mirror):
    del mirror.files[weights_path(mirror)]
    url = f"{mirror.url}/{SMALL.shape}/{SMALL.weights_name}"
    with pytest.raises(DownloadError, match=rf"cannot download {url}: HTTP 404"):
        download("small", progress=False)
    assert not (cached() / SMALL.weights_name).exists()
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "HTTP 404" in result.stderr


def test_unwritable_cache_names_the_folder_and_the_variable(mirror, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("SPACY_ELMO_CACHE", str(blocker))
    with pytest.raises(DownloadError, match=rf"cannot write the spacy-elmo cache {blocker}/.*"):
        download("small", progress=False)
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1 and "set SPACY_ELMO_CACHE" in result.stderr
    assert mirror.requests == []


def test_offline_gives_one_clear_error(mirror, monkeypatch):
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("SPACY_ELMO_MIRROR", f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError, match=r"cannot reach http://127.0.0.1.*SPACY_ELMO_MIRROR"):
        download("small", progress=False)
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1 and "cannot reach" in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_cache_default_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SPACY_ELMO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert published.cache_dir() == tmp_path / "spacy-elmo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert published.cache_dir() == Path.home() / ".cache" / "spacy-elmo"
    monkeypatch.delenv("SPACY_ELMO_MIRROR", raising=False)
    assert SMALL.url(SMALL.weights_name) == (
        "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
        "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5"
    )


# ------------------------------------------------------------------------ configs
PIPELINE_CONFIG = """
[nlp]
lang = "en"
pipeline = ["elmo"]

[components]

[components.elmo]
factory = "elmo"

[initialize]

[initialize.components]

[initialize.components.elmo]

[initialize.components.elmo.weights]
@misc = "spacy_elmo.PublishedWeights.v1"
name = "small"
"""


def test_published_weights_download_at_initialize(mirror, source):
    import spacy
    from thinc.api import Config

    nlp = spacy.util.load_model_from_config(Config().from_str(PIPELINE_CONFIG), auto_fill=True)
    assert mirror.requests == []  # nothing fetched when the config is read
    nlp.initialize()
    assert (cached() / SMALL.weights_name).is_file()
    doc = nlp.make_doc("The river bank .")
    doc = nlp(doc)
    expected = reference(source).embed([[t.text for t in doc]])[0]
    numpy.testing.assert_allclose(doc._.elmo_layers, expected, atol=1e-5, rtol=0)


def test_published_weights_offline_at_initialize(mirror, monkeypatch):
    import spacy
    from thinc.api import Config

    monkeypatch.setenv("SPACY_ELMO_MIRROR", "http://127.0.0.1:9")
    nlp = spacy.util.load_model_from_config(Config().from_str(PIPELINE_CONFIG), auto_fill=True)
    with pytest.raises(DownloadError, match="cannot reach .*SPACY_ELMO_MIRROR"):
        nlp.initialize()


def test_published_weights_unknown_name():
    from spacy.util import registry

    with pytest.raises(ValueError, match="unknown published biLM 'huge'"):
        registry.resolve({"w": {"@misc": "spacy_elmo.PublishedWeights.v1", "name": "huge"}})


def test_init_config_names_the_published_loader(mirror, tmp_path, source):
    from spacy.util import load_config, registry

    download("small", progress=False)
    path = tmp_path / "config.cfg"
    result = CliRunner().invoke(
        app, ["init-config", str(path), "--components", "ner", "-m", "small"]
    )
    assert result.exit_code == 0, result.output
    config = load_config(path, interpolate=True)
    block = config["initialize"]["components"]["elmo"]["weights"]
    assert block == {"@misc": "spacy_elmo.PublishedWeights.v1", "name": "small"}
    assert "published AllenNLP biLM 'small'" in path.read_text().splitlines()[1]
    same_weights(registry.resolve({"w": block})["w"](), reference(source))
