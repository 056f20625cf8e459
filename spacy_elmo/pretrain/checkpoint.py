"""A run directory and its checkpoint. The directory belongs to one run: locked while it trains,
and one holding a run is continued (`resume`), started again (`overwrite`) or refused, so that new
inputs or settings are never silently ignored in favour of an old corpus cache and vocabulary.
Checkpoints are written atomically, of plain types and tensors only, so that they load with
`torch.load(weights_only=True)` and a crafted file cannot run code."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from ..util.files import LockHeld, atomic_path, lock_file
from ..weights.tensors import check_weights, read_torch_file

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
CHECKPOINT = "checkpoints/last.pt"  # a run's checkpoint, in its directory
FORMAT_NAME = "spacy-elmo-pretrain-checkpoint"
FORMAT_VERSION = 1
# key -> the types its value may have
REQUIRED = {
    "config": (dict,),
    "model": (dict,),
    "optimizer": (dict,),
    "scheduler": (dict,),
    "torch_rng": (torch.Tensor,),
    "step": (int,),
    "tokens_seen": (int,),
    "train_seconds": (float, int),
}


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


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` atomically (a killed write leaves the previous checkpoint)."""
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT_NAME, "version": FORMAT_VERSION, **state}, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's state, checked; ValueError naming the file if it is not a sound one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"cannot resume: no checkpoint at {path}; to start this run again, do not resume "
            f"(and overwrite the run if the directory holds an unfinished one)"
        )
    if path.stat().st_size == 0:
        raise ValueError(f"checkpoint {path} is empty (a write that never completed?)")
    state = read_torch_file(path, "checkpoint")
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} is not a spacy-elmo checkpoint (not a dict)")
    found = (state.get("format", FORMAT_NAME), state.get("version", FORMAT_VERSION))
    if found != (FORMAT_NAME, FORMAT_VERSION):
        raise ValueError(
            f"checkpoint {path} has format {found[0]!r} version {found[1]!r}; this spacy-elmo "
            f"reads {FORMAT_NAME} version {FORMAT_VERSION}"
        )
    for key, types in REQUIRED.items():
        if key not in state:
            raise ValueError(f"checkpoint {path} has no '{key}': not a spacy-elmo checkpoint")
        value = state[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise ValueError(
                f"checkpoint {path}: '{key}' is a {type(value).__name__}, expected "
                f"{' or '.join(t.__name__ for t in types)}"
            )
    if state["step"] < 0:
        raise ValueError(f"checkpoint {path}: negative step {state['step']}")
    model = state["model"]
    if not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise ValueError(f"checkpoint {path}: 'model' holds values that are not tensors")
    check_weights(model, f"checkpoint {path}")
    return state
