"""The temporary files of a corpus run: named so that a run knows them for its own.

Every file a run writes is written as `.NAME.spacy-elmo-tmp-XXXXXXXX` (through `atomic_path`'s
`..NAME.spacy-elmo-tmp-XXXXXXXX.YYYYYYYY.tmp`) and renamed when whole. A run removes a file only
when its name is of this family *and* NAME is a file the run itself writes there.
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
    """A temporary name next to `path`, in the run's family; the block writes it whole (through
    `atomic_path` or a writer that uses it, such as `embed_file`). With `install` it is then
    renamed over `path` (a part); else it is left for the driver, which installs an output only
    once the manifest records it (`runner`). An error in the block removes it."""
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
    """What a worker does with a shard's output: `write(stage)` writes it (and returns its lines)
    under a `staged` name; a part is then installed, an output left for the driver. What the
    worker reports: the lines, and for an output, the stage and its sha256."""
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
