"""A run directory belongs to one run: an exclusive lock while it trains, no silent reuse.

`pretrain` into a directory that already holds a run continues it (`resume`) or starts it
again from nothing (`overwrite`, which deletes the old run's files first); without either it
is refused, so that new inputs or settings are never silently ignored in favour of an old
corpus cache and vocabulary.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..util.files import FileLock, LockHeld, lock_file

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
    """An exclusive lock (`util.files.lock_file`) on DIRECTORY/pretrain.lock, which holds the
    owner's pid."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_NAME
        self._lock: FileLock | None = None

    def acquire(self) -> None:
        """Take the lock or raise ValueError naming the directory and the holder's pid."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock = lock_file(self.path, f"{os.getpid()}\n")
        except LockHeld as held:
            raise ValueError(
                f"run directory {self.directory} is in use by another pretraining run "
                f"(pid {held.text[:32].strip() or 'unknown'}, lock file {self.path}); wait for "
                f"it to end or use another output directory"
            ) from None
        except OSError as err:  # the folder or the file, or a file system without locks
            raise ValueError(
                f"cannot use run directory {self.directory}: {err.strerror or err}"
            ) from None

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

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
