"""The temporary files of a corpus run, `.NAME.spacy-elmo-tmp-XXXXXXXX`, named so that a run
removes only its own: a name of this family for a file NAME that the run itself writes there.
"""

from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Collection, Iterator, Optional

from ..util.files import file_sha256, fsync_directory

MARK = ".spacy-elmo-tmp-"
# `.NAME<MARK>XXXXXXXX` (the staged file) or `..NAME<MARK>XXXXXXXX.YYYYYYYY.tmp` (mkstemp's
# temporary file of atomic_path, 8 characters of [a-z0-9_]; `.probe`: check_output's probe).
_OWNED = re.compile(
    r"^\.(?P<inner>\.)?(?P<name>.+)"
    + re.escape(MARK)
    + r"[0-9a-f]{8}(?(inner)\.[a-z0-9_]{8}\.(?:tmp|probe))$",
    re.DOTALL,
)


def owned_name(filename: str) -> Optional[str]:
    """NAME when `filename` is a corpus run's temporary file for NAME, else None."""
    match = _OWNED.match(filename)
    return match.group("name") if match else None


@contextmanager
def staged(path: Path, install: bool = True) -> Iterator[Path]:
    """A temporary name next to `path` for the block to write whole; with `install` it is then
    renamed over `path` (a part), else left for the driver (an output, installed once recorded).
    An error in the block removes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stage = path.parent / f".{path.name}{MARK}{secrets.token_hex(4)}"
    try:
        yield stage
        if install:
            os.replace(stage, path)
    except BaseException:
        stage.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_output(payload: dict, write: Callable[[Path], int]) -> dict:
    """A shard's output written by `write(stage)` (which returns its lines) under a `staged` name;
    the worker's report: the lines, and for an output left for the driver, its stage and sha256."""
    install = payload["kind"] == "part"
    with staged(Path(payload["output"]), install) as stage:
        lines = write(stage)
    if install:
        return {"lines": lines}
    return {"lines": lines, "staged": str(stage), "sha256": file_sha256(stage)}


def remove_owned(folder: Path, names: Optional[Collection[str]] = None) -> None:
    """Remove the run's temporary files in `folder` (not below it) for the file names `names`
    (None: for any name, in a folder that is the run's own, a folder of parts)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no such folder (yet), or not one
        return
    for entry in entries:
        name = owned_name(entry.name)
        if name is None or (names is not None and name not in names):
            continue
        if entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)
