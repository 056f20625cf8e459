"""Files written whole, hashed and locked (no spaCy, no torch: usable from every layer).

An output is written to a temporary file beside it, flushed and renamed over the final name
only when complete (`atomic_path`): an interrupted write leaves the earlier file as it was.
A run that must be alone holds filelock's lock (`lock_file`), dropped when its process ends.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

HASH_BLOCK_BYTES = 1 << 20
# What a refused run reads of a held lock file (its holder's description).
LOCK_TEXT_BYTES = 4096


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to `path`; it replaces `path` when the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # A new file (never another's), with the mode the umask gives new files (not mkstemp's 0600)
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_text(path: str | Path, text: str) -> None:
    """Write a UTF-8 text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def place(path: str | Path, other: str | Path) -> Optional[str]:
    """Where `path` is with respect to `other`, by name, links and `..` resolved: "is", "is
    inside" (the folder `other`), "contains" (the folder `path` holds `other`) or None."""
    path, other = Path(path).resolve(), Path(other).resolve()
    if path == other:
        return "is"
    if other in path.parents:
        return "is inside"
    return "contains" if path in other.parents else None


def check_apart(output: str | Path, others: Iterable[str | Path], what: str = "the input") -> None:
    """ValueError when the output folder `output` is, is inside or contains one of `others`
    (what writing it could overwrite, or what would be read back as its own output)."""
    for other in others:
        where = place(output, other)
        if where is not None:
            raise ValueError(
                f"output folder {printable(output)} {where} {what} {printable(other)}: "
                "choose another output folder"
            )


def printable(path: str | Path) -> str:
    """A path for messages: a name that is not UTF-8 shows its bytes as \\xNN."""
    return os.fsencode(os.fspath(path)).decode("utf-8", "backslashreplace")


def check_output(output: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Raise ValueError when the output file `output` is one of `inputs` by any name (a link,
    `..`, a hard link), is a folder or cannot be written: at once, not after the computation.
    """
    output = Path(output)
    for item in inputs:
        if output.exists() and Path(item).exists() and os.path.samefile(output, item):
            raise ValueError(f"output {output} is the input {item}: writing it would destroy it")
    if output.is_dir():
        raise ValueError(f"output {output} is a directory, not a file")
    try:
        probe_writable(output)
    except OSError as err:
        raise ValueError(f"cannot write output {output}: {err.strerror or err}") from None


def probe_writable(path: Path) -> None:
    """Create a file beside `path` (its folder made if needed) and remove it: the OSError of a
    place that cannot be written, raised before any work."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
    os.close(fd)
    os.unlink(name)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(folder: Path) -> None:
    """Make the rename durable (best effort: not every system opens or syncs folders)."""
    with suppress(OSError):
        _fsync(folder)


# ------------------------------------------------------------------------------- hashing
def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of the bytes of `path`, read in blocks of HASH_BLOCK_BYTES."""
    digest = hashlib.sha256()
    _update(digest, Path(path))
    return digest.hexdigest()


def files_sha256(named_files: Iterable[tuple[bytes, str | Path]]) -> str:
    """The sha256 hex digest over each (name, file) in turn: the name, a NUL byte, then the
    file's bytes (so that a file renamed, or bytes moved from one file to the next, differ)."""
    digest = hashlib.sha256()
    for name, path in named_files:
        digest.update(name + b"\0")
        _update(digest, Path(path))
    return digest.hexdigest()


def _update(digest: Any, path: Path) -> None:
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(HASH_BLOCK_BYTES), b""):
            digest.update(block)


# ------------------------------------------------------------------------------- locking
class LockHeld(BlockingIOError):
    """The lock on `path` is held by another run: `text` is what the lock file holds, its
    holder's description where the holder wrote one."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__(errno.EWOULDBLOCK, f"{path} is locked by another process")
        self.path, self.text = path, text


def lock_file(path: str | Path, holder: Optional[str] = None) -> Any:
    """An exclusive lock on `path` (filelock's, an flock that the kernel drops when its process
    ends, however it ends), taken without waiting and held until `release()` or the end of its
    `with` block. `holder`: what the file then holds (who holds it), for a refused run to name.
    LockHeld when another run holds it; OSError when the file cannot be opened or locked."""
    from filelock import FileLock, Timeout

    def describe(fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode("utf-8"), 0)

    lock = FileLock(path, blocking=False, on_acquired=describe if holder else None)
    try:
        lock.acquire()
    except Timeout:
        try:
            text = Path(path).read_bytes()[:LOCK_TEXT_BYTES].decode("utf-8", "replace")
        except OSError:
            text = ""
        raise LockHeld(Path(path), text) from None
    return lock
