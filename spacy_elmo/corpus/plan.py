"""What a corpus run reads and writes: the input files (a folder, a glob or a file), each read
once before anything is written (sha256, lines, shard offsets, a check that it is readable).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..util.files import check_apart, printable
from .embed_file import LineRange, decode_line
from .engine import check_positive


@dataclass(frozen=True)
class InputFile:
    """One input file, checked: where it is, what it is, and where its output goes."""

    path: Path  # absolute
    output_rel: Path  # REL/NAME<output suffix>, REL relative to INPUT's folder or glob
    sha256: str
    lines: int  # lines of text (.txt), JSON objects (.jsonl), documents (.spacy)
    shards: tuple[LineRange, ...]  # one for a file of at most the shard size


def find_inputs(spec: str | Path, suffixes: Sequence[str]) -> tuple[Path, list[Path]]:
    """The folder that relative names start from, and the input files `spec` names, sorted: a
    folder's files with one of `suffixes` (recursively), a glob's matches (`**` spans folders,
    as in `glob.glob(recursive=True)`), or a file. Each real folder is walked once (`walk_files`).
    """
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        root = path.resolve()
        found = [p for p in walk_files(root) if Path(p).suffix in suffixes]
    elif path.is_file():
        root, found = path.resolve().parent, [path.resolve()]
    elif glob.has_magic(text):
        root, found = _glob_files(text)
    else:
        raise FileNotFoundError(
            f"input {printable(text)} is not a file, a folder or a glob pattern"
        )
    files = sorted({Path(os.path.abspath(p)) for p in found})
    if not files:
        raise ValueError(
            f"input {printable(text)} names no files (looked for {', '.join(suffixes)})"
        )
    return root, files


def walk_files(root: Path, hidden: bool = True, max_depth: Optional[int] = None) -> Iterator[str]:
    """Every file under `root` (files, links to files, broken links), each real folder once (the
    first way to it, folders before links), so that links to a folder above end. `hidden=False`
    skips folders named ".*"; `max_depth` limits the levels entered below `root`."""
    seen: set[tuple[int, int]] = set()
    links: deque[str] = deque()
    top = os.fspath(root)

    def tree(start: str) -> Iterator[str]:
        for folder, dirs, names in os.walk(start):  # links to folders: queued, walked later
            try:
                stat = os.stat(folder)
            except OSError:
                dirs[:] = []
                continue
            if (stat.st_dev, stat.st_ino) in seen:
                dirs[:] = []
                continue
            seen.add((stat.st_dev, stat.st_ino))
            depth = len(Path(folder).relative_to(top).parts)
            kept = []
            for name in sorted(dirs):
                if (not hidden and name.startswith(".")) or (
                    max_depth is not None and depth >= max_depth
                ):
                    continue
                if os.path.islink(os.path.join(folder, name)):
                    links.append(os.path.join(folder, name))
                else:
                    kept.append(name)
            dirs[:] = kept
            for name in sorted(names):
                yield os.path.join(folder, name)

    yield from tree(top)
    while links:
        yield from tree(links.popleft())


def _glob_files(text: str) -> tuple[Path, list[str]]:
    """The folder before the first component of glob pattern `text` with a wildcard, and the
    files under it whose path below it matches the rest, with glob.glob's rules (`**` any number
    of folders; a wildcard matches no name starting with "." unless the pattern's)."""
    parts = Path(text).expanduser().parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    root = Path(os.path.abspath(Path(*parts[:fixed]))) if fixed else Path.cwd()
    pattern = parts[fixed:]
    hidden = any(part.startswith(".") for part in pattern)
    depth = None if "**" in pattern else len(pattern) - 1
    found = walk_files(root, hidden=hidden, max_depth=depth)  # none where root is no folder
    matches = [p for p in found if _matches(Path(p).relative_to(root).parts, pattern)]
    return root, [p for p in matches if os.path.isfile(p)]


def _matches(names: Sequence[str], pattern: Sequence[str]) -> bool:
    if not pattern:
        return not names
    part = pattern[0]
    if part == "**":
        if _matches(names, pattern[1:]):
            return True
        return bool(names) and not names[0].startswith(".") and _matches(names[1:], pattern)
    if not names or (names[0].startswith(".") and not part.startswith(".")):
        return False  # a wildcard matches no hidden name
    return fnmatch.fnmatchcase(names[0], part) and _matches(names[1:], pattern[1:])


def plan_inputs(
    spec: str | Path,
    output_dir: Path,
    suffixes: Sequence[str],
    output_suffix: str,
    shard_lines: int,
    text_key: Optional[str] = None,
) -> list[InputFile]:
    """Find and check every input; ValueError naming the first bad one."""
    check_positive(shard_lines=shard_lines)
    root, files = find_inputs(spec, suffixes)
    output_dir = Path(os.path.abspath(output_dir))
    if Path(str(spec)).expanduser().is_dir():
        check_apart(output_dir, [root], "the input folder")
    seen: dict[Path, Path] = {}
    outputs: dict[Path, Path] = {}
    inputs = []
    for path in files:
        real = path.resolve()
        check_apart(output_dir, [path])
        if real in seen:
            raise ValueError(
                f"input {printable(path)} is named twice: it is the same file as "
                f"{printable(seen[real])}"
            )
        seen[real] = path
        output_rel = path.relative_to(root).with_suffix(output_suffix)
        if output_rel in outputs:
            raise ValueError(
                f"inputs {printable(outputs[output_rel])} and {printable(path)} would both "
                f"write {printable(output_dir / output_rel)}; rename one"
            )
        _check_writable(output_dir, output_rel)
        outputs[output_rel] = path
        key = text_key if path.suffix == ".jsonl" else None
        inputs.append(scan(path, output_rel, shard_lines, key))
    return inputs


def scan(
    path: Path, output_rel: Path, shard_lines: int, text_key: Optional[str] = None
) -> InputFile:
    """Read `path` once: sha256, lines, shards of `shard_lines` lines (each with its first line's
    byte offset); ValueError if unreadable, empty or bad."""
    digest = hashlib.sha256()
    try:
        if path.suffix == ".spacy":
            return _scan_docbin(path, output_rel)
        offsets = []
        lines = 0
        position = 0
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                line_start = position
                position += len(raw)
                digest.update(raw)
                decoded = decode_line(raw, number, f"input file {printable(path)}")
                if text_key is not None:
                    if not decoded.strip():
                        continue
                    _check_json_line(path, number, decoded, text_key)
                if lines % shard_lines == 0:
                    offsets.append(line_start)
                lines += 1
    except OSError as err:
        raise ValueError(
            f"input file {printable(path)} cannot be read: {err.strerror or err}"
        ) from None
    if lines == 0:
        raise ValueError(f"input file {printable(path)} is empty")
    shards = tuple(
        LineRange(first, offset, min(shard_lines, lines - first))
        for first, offset in zip(range(0, lines, shard_lines), offsets)
    )
    return InputFile(path, output_rel, digest.hexdigest(), lines, shards)


def _scan_docbin(path: Path, output_rel: Path) -> InputFile:
    """A DocBin is one shard (its documents cannot be read from an offset)."""
    from spacy.tokens import DocBin

    data = path.read_bytes()
    try:
        count = len(DocBin().from_bytes(data))
    except Exception as err:  # noqa: BLE001 - any failure to parse is a bad input
        raise ValueError(f"input file {printable(path)} is not a spaCy DocBin ({err})") from None
    if count == 0:
        raise ValueError(f"input file {printable(path)} is empty (a DocBin without documents)")
    whole = (LineRange(0, 0, count),)
    return InputFile(path, output_rel, hashlib.sha256(data).hexdigest(), count, whole)


def _check_json_line(path: Path, number: int, line: str, text_key: str) -> None:
    try:
        record = json.loads(line)
    except ValueError as err:
        raise ValueError(f"input file {printable(path)}, line {number}: not JSON ({err})") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
        raise ValueError(
            f"input file {printable(path)}, line {number}: no string under the text key "
            f"{text_key!r}"
        )


def _check_writable(output_dir: Path, output_rel: Path) -> None:
    """Refuse an output sure to fail: a folder in its place, or a file where a folder goes."""
    target = output_dir / output_rel
    if target.is_dir():
        raise ValueError(
            f"output {printable(target)} is a folder: remove it or choose another output folder"
        )
    for folder in reversed(target.parents):
        if folder in output_dir.parents:
            continue
        if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
            raise ValueError(
                f"output {printable(target)} cannot be written: {printable(folder)} is a file, "
                "not a folder"
            )
