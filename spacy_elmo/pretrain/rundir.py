"""A run directory belongs to one run: an exclusive lock while it trains, no silent reuse.

`pretrain` into a directory that already holds a run continues it (`resume`) or starts it
again from nothing (`overwrite`, which deletes the old run's files first); without either it
is refused, so that new inputs or settings are never silently ignored in favour of an old
corpus cache and vocabulary.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

LOCK_NAME = "pretrain.lock"
# What a run writes into its directory (all of it goes with `overwrite`).
RUN_FILES = (
    "checkpoints",
    "corpus",
    "vocab.txt",
    "metrics.jsonl",
    "model",
    "allennlp",
    "perplexity.png",
)


class RunDirectoryLock:
    """An exclusive `fcntl.flock` on DIRECTORY/pretrain.lock, which holds the owner's pid."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ValueError naming the directory and the holder's pid."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise ValueError(
                f"cannot use run directory {self.directory}: {err.strerror or err}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ValueError(f"cannot lock run directory {self.directory}: {err}") from None
            raise ValueError(
                f"run directory {self.directory} is in use by another pretraining run "
                f"(pid {holder}, lock file {self.path}); wait for it to end or use another "
                f"output directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def existing_run_files(directory: Path) -> list[str]:
    """The names of RUN_FILES present in `directory` (empty folders do not count)."""
    found = []
    for name in RUN_FILES:
        path = directory / name
        if path.is_dir() and not any(path.iterdir()):
            continue
        if path.exists():
            found.append(name)
    return found


def prepare_run_directory(directory: Path, resume: bool, overwrite: bool) -> None:
    """Check that a new run may start in `directory` (deleting an old run with `overwrite`).

    Call it while holding the directory's lock.
    """
    if resume and overwrite:
        raise ValueError("resume continues a run and overwrite deletes it: ask for only one")
    if resume:
        return
    existing = existing_run_files(directory)
    if not existing:
        return
    if not overwrite:
        raise ValueError(
            f"run directory {directory} already holds a run ({', '.join(existing)}): continue it "
            "with --resume, start it again from nothing with --force (deletes those files), or "
            "name another output directory"
        )
    for name in existing:
        path = directory / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
