"""A run directory belongs to one run: locked while it trains, and a directory holding a run
is continued (`resume`), started again (`overwrite`) or refused, so that new inputs or
settings are never silently ignored in favour of an old corpus cache and vocabulary."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..util.files import LockHeld, lock_file

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


@contextmanager
def locked_run_directory(directory: Path) -> Iterator[None]:
    """An exclusive lock on DIRECTORY/pretrain.lock (holding the owner's pid) while in the
    block; ValueError naming the directory and the holder's pid when it is taken."""
    path = directory / LOCK_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = lock_file(path, f"{os.getpid()}\n")
    except LockHeld as held:
        raise ValueError(
            f"run directory {directory} is in use by another pretraining run "
            f"(pid {held.text[:32].strip() or 'unknown'}, lock file {path}); wait for "
            f"it to end or use another output directory"
        ) from None
    except OSError as err:  # the folder or the file, or a file system without locks
        raise ValueError(f"cannot use run directory {directory}: {err.strerror or err}") from None
    try:
        yield
    finally:
        lock.release()


def prepare_run_directory(directory: Path, resume: bool, overwrite: bool) -> None:
    """Check that a run may start in `directory` (deleting an old run with `overwrite`);
    call it holding the directory's lock."""
    if resume and overwrite:
        raise ValueError("resume continues a run and overwrite deletes it: ask for only one")
    if resume:
        return
    paths = [directory / name for name in RUN_FILES]
    # what a run wrote here: a file, or a folder that holds something
    existing = [p for p in paths if (any(p.iterdir()) if p.is_dir() else p.exists())]
    if not existing:
        return
    if not overwrite:
        raise ValueError(
            f"run directory {directory} already holds a run ({', '.join(p.name for p in existing)}"
            "): continue it with --resume, start it again from nothing with --force (deletes those "
            "files), or name another output directory"
        )
    for path in existing:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
