"""`spacy-elmo download` and the published names, against an HTTP server on 127.0.0.1.

The server holds the AllenNLP test fixture under the published layout of `small` (and of
`original` for the config tests); it can cut a transfer, ignore Range and change a file.
Every download goes to `SPACY_ELMO_CACHE` = a temporary folder, from `SPACY_ELMO_MIRROR`.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
from pathlib import Path

import h5py
import numpy
import pytest
import torch
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.bilm import published
from spacy_elmo.bilm.json_files import MissingFileError
from spacy_elmo.bilm.published import ChecksumError, DownloadError, download
from spacy_elmo.bilm.sources import resolve_source
from spacy_elmo.cli import app

SMALL = published.PUBLISHED["small"]
ORIGINAL = published.PUBLISHED["original"]
WORDS = [["The", "river", "bank", "."], ["ok"]]


class Mirror(http.server.ThreadingHTTPServer):
    """A static file server with Range support and faults on demand."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.cuts: dict[str, list[int]] = {}  # path -> bytes sent by each next response
        self.ignore_range = False

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
        data = mirror.files.get(self.path)
        if data is None:
            self.send_error(404, "Not Found")
            return
        start, status = 0, 200
        requested = self.headers.get("Range")
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
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cuts = mirror.cuts.get(self.path)
        if cuts:
            self.wfile.write(body[: cuts.pop(0)])  # then the connection closes
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fixture_files(allennlp_fixture) -> dict[str, bytes]:
    return {
        "options": (allennlp_fixture / "options.json").read_bytes(),
        "weights": (allennlp_fixture / "lm_weights.hdf5").read_bytes(),
    }


@pytest.fixture
def mirror(fixture_files, tmp_path, monkeypatch):
    """The server, with `small` and `original` (both the fixture), as SPACY_ELMO_MIRROR, and
    an empty SPACY_ELMO_CACHE."""
    server = Mirror()
    for model in (SMALL, ORIGINAL):
        server.files[f"/{model.shape}/{model.options_name}"] = fixture_files["options"]
        server.files[f"/{model.shape}/{model.weights_name}"] = fixture_files["weights"]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("SPACY_ELMO_MIRROR", server.url + "/")
    monkeypatch.setenv("SPACY_ELMO_CACHE", str(tmp_path / "cache"))
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def weights_path(mirror: Mirror, model=SMALL) -> str:
    return f"/{model.shape}/{model.weights_name}"


def cached(model=SMALL) -> Path:
    return published.cache_dir() / model.shape


def same_weights(a: BiLM, b: BiLM) -> None:
    assert a.options == b.options
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def reference(allennlp_fixture) -> BiLM:
    return BiLM.from_allennlp(
        allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5"
    )


# ------------------------------------------------------------------------ a whole download
def test_download_then_load_by_name(mirror, fixture_files, allennlp_fixture):
    options, weights = download("small", progress=False)
    assert options.read_bytes() == fixture_files["options"]
    assert weights.read_bytes() == fixture_files["weights"]
    assert sorted(p.name for p in cached().iterdir()) == sorted(
        [SMALL.options_name, SMALL.weights_name, published.RECORD_NAME]
    )
    record = json.loads((cached() / published.RECORD_NAME).read_text())["files"]
    for name, key in ((SMALL.options_name, "options"), (SMALL.weights_name, "weights")):
        assert record[name]["size"] == len(fixture_files[key])
        assert record[name]["sha256"] == hashlib.sha256(fixture_files[key]).hexdigest()
    assert mirror.ranges(SMALL.weights_name) == [None]
    source = resolve_source("small")
    assert (source.kind, source.options_file, source.weights_file) == ("allennlp", options, weights)
    same_weights(BiLM.load("small"), reference(allennlp_fixture))
    # Again: verified against the record, not fetched.
    download("small", progress=False)
    assert len(mirror.ranges(SMALL.weights_name)) == 1


def test_download_command_and_embed_by_name(mirror, allennlp_fixture, tmp_path):
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
    expected = reference(allennlp_fixture).embed(WORDS)
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
    with pytest.raises(DownloadError, match=rf"cut at {half} of {len(fixture_files['weights'])}"):
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


def test_cut_transfer_is_resumed_within_one_download(mirror, fixture_files):
    mirror.cuts[weights_path(mirror)] = [1000, 5000]
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name) == [None, "bytes=1000-", "bytes=6000-"]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_server_ignoring_range_restarts_cleanly(mirror, fixture_files):
    cached().mkdir(parents=True)
    part = cached() / (SMALL.weights_name + ".part")
    part.write_bytes(b"not a prefix of the file")
    mirror.ignore_range = True
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name) == [f"bytes={len(b'not a prefix of the file')}-"]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_part_longer_than_the_file_restarts_cleanly(mirror, fixture_files):
    cached().mkdir(parents=True)
    size = len(fixture_files["weights"])
    (cached() / (SMALL.weights_name + ".part")).write_bytes(b"x" * (size + 10))
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name) == [f"bytes={size + 10}-", None]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_a_whole_part_is_installed_without_a_transfer(mirror, fixture_files):
    """A part that is already whole (a download cut between transfer and rename): the server
    answers 416 with the size, and the part is checked and renamed."""
    cached().mkdir(parents=True)
    size = len(fixture_files["weights"])
    (cached() / (SMALL.weights_name + ".part")).write_bytes(fixture_files["weights"])
    download("small", progress=False)
    assert mirror.ranges(SMALL.weights_name) == [f"bytes={size}-"]
    assert (cached() / SMALL.weights_name).read_bytes() == fixture_files["weights"]


def test_a_second_download_of_the_same_file_stops(mirror):
    fcntl = pytest.importorskip("fcntl")
    cached().mkdir(parents=True)
    part = cached() / (SMALL.options_name + ".part")
    with part.open("a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(DownloadError, match=f"another download is writing {part}"):
            download("small", progress=False)
    assert mirror.requests == []


def test_a_file_mirror(fixture_files, tmp_path, monkeypatch):
    """An air-gapped mirror can be a folder: SPACY_ELMO_MIRROR=file:///..."""
    root = tmp_path / "mirror" / SMALL.shape
    root.mkdir(parents=True)
    (root / SMALL.options_name).write_bytes(fixture_files["options"])
    (root / SMALL.weights_name).write_bytes(fixture_files["weights"])
    monkeypatch.setenv("SPACY_ELMO_MIRROR", (tmp_path / "mirror").as_uri())
    monkeypatch.setenv("SPACY_ELMO_CACHE", str(tmp_path / "cache"))
    _, weights = download("small", progress=False)
    assert weights.read_bytes() == fixture_files["weights"]


# ------------------------------------------------------------------------ checksums
def test_a_changed_file_on_the_server_is_refused(mirror, fixture_files):
    download("small", progress=False)
    final = cached() / SMALL.weights_name
    changed = bytearray(fixture_files["weights"])
    changed[-1] ^= 0xFF
    mirror.files[weights_path(mirror)] = bytes(changed)
    expected = hashlib.sha256(fixture_files["weights"]).hexdigest()
    got = hashlib.sha256(bytes(changed)).hexdigest()
    with pytest.raises(ChecksumError, match=rf"expected .* sha256 {expected}; got .* {got}"):
        download("small", force=True, progress=False)
    assert final.read_bytes() == fixture_files["weights"]  # the verified copy stays
    assert not final.with_name(final.name + ".part").exists()  # the bad one is deleted


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
name = "original"
"""


@pytest.mark.filterwarnings("ignore:nothing listens")
def test_published_weights_download_at_initialize(mirror, allennlp_fixture):
    import spacy
    from thinc.api import Config

    nlp = spacy.util.load_model_from_config(Config().from_str(PIPELINE_CONFIG), auto_fill=True)
    assert mirror.requests == []  # nothing fetched when the config is read
    nlp.initialize()
    assert (cached(ORIGINAL) / ORIGINAL.weights_name).is_file()
    doc = nlp.make_doc("The river bank .")
    doc = nlp(doc)
    expected = reference(allennlp_fixture).embed([[t.text for t in doc]])[0]
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


def test_init_config_names_the_published_loader(mirror, tmp_path, allennlp_fixture):
    from spacy.util import load_config, registry

    download("original", progress=False)
    path = tmp_path / "config.cfg"
    result = CliRunner().invoke(app, ["init-config", str(path), "-p", "ner", "-m", "original"])
    assert result.exit_code == 0, result.output
    config = load_config(path, interpolate=True)
    block = config["initialize"]["components"]["elmo"]["weights"]
    assert block == {"@misc": "spacy_elmo.PublishedWeights.v1", "name": "original"}
    assert "published AllenNLP biLM 'original'" in path.read_text().splitlines()[1]
    same_weights(registry.resolve({"w": block})["w"](), reference(allennlp_fixture))
