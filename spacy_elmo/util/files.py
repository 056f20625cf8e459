"""Writing outputs without losing data (no spaCy, no torch: usable from every layer).

Every output is written to a temporary file in its own folder, flushed to disk and renamed over
the final name only when complete: an interrupted write (Ctrl-C, SIGKILL, a full disk) leaves
the earlier file as it was, and a half-written file never has the final name.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to `path`; it replaces `path` when the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; give it the usual mode
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


def check_output(output: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """Raise ValueError unless `output` can be written and is none of `inputs` (nor in them).

    Called before the computation, so that an unwritable path fails at once, not at the end.
    """
    output = Path(output)
    for item in inputs:
        item = Path(item)
        same = output.resolve() == item.resolve()
        if not same and output.exists() and item.exists():
            same = os.path.samefile(output, item)
        if same:
            raise ValueError(f"output {output} is the input {item}: writing it would destroy it")
        if item.is_dir() and item.resolve() in output.resolve().parents:
            raise ValueError(f"output {output} is inside the input folder {item}")
    if output.is_dir():
        raise ValueError(f"output {output} is a directory, not a file")
    folder = output.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=f".{output.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        raise ValueError(f"cannot write output {output}: {err.strerror or err}") from None


def _umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:  # pragma: no cover - not Linux
        pass
    mask = os.umask(0o022)  # pragma: no cover
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(folder: Path) -> None:
    """Make the rename durable (best effort: not every file system syncs folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
