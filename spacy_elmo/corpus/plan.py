"""What a corpus run reads and writes: the input files, checked, and their shards.

INPUT is a folder (searched recursively for the input suffixes), a glob pattern or one file.
Every input is read once here, before anything is written: its sha256, its number of lines,
the byte offset of every shard's first line, and a check that it is readable, non-empty UTF-8
(for .jsonl: one JSON object per line with a string under the text key). A bad input stops the
run with an error naming the file.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..embed_file import LineRange

TEXT_SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class InputFile:
    """One input file, checked: where it is, what it is, and where its output goes."""

    path: Path  # absolute
    rel: Path  # relative to INPUT's folder (or the glob's fixed part)
    output_rel: Path  # REL/NAME<output suffix>
    sha256: str
    lines: int  # lines of text (.txt), JSON objects (.jsonl), documents (.spacy)
    size: int
    offsets: tuple[int, ...]  # byte offset of each shard's first line (one shard: (0,))
    shard_lines: int

    def shards(self) -> list[Optional[LineRange]]:
        """None for a file that is one shard, else the line ranges of its parts."""
        if len(self.offsets) == 1:
            return [None]
        return [
            LineRange(
                i * self.shard_lines,
                offset,
                min(self.shard_lines, self.lines - i * self.shard_lines),
            )
            for i, offset in enumerate(self.offsets)
        ]


def find_inputs(spec: str | Path, suffixes: Sequence[str]) -> tuple[Path, list[Path]]:
    """The folder that relative names start from, and the input files `spec` names, sorted.

    A folder: every file under it (recursively) with one of `suffixes`; a glob pattern: the
    files it matches (`**` spans folders); a file: itself.
    """
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_dir():
        root = path.resolve()
        found = [
            Path(folder) / name
            for folder, _, names in os.walk(root, followlinks=True)
            for name in names
            if Path(name).suffix in suffixes
        ]
    elif path.is_file():
        root, found = path.resolve().parent, [path.resolve()]
    elif glob.has_magic(text):
        root = _fixed_part(text)
        found = [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file()]
    else:
        raise FileNotFoundError(f"input {text} is not a file, a folder or a glob pattern")
    files = sorted({Path(os.path.abspath(p)) for p in found})
    if not files:
        raise ValueError(f"input {text} names no files (looked for {', '.join(suffixes)})")
    return root, files


def plan_inputs(
    spec: str | Path,
    output_dir: Path,
    suffixes: Sequence[str],
    output_suffix: str,
    shard_lines: int,
    text_key: Optional[str] = None,
) -> list[InputFile]:
    """Find and check every input; ValueError naming the first bad one."""
    if not isinstance(shard_lines, int) or shard_lines < 1:
        raise ValueError(f"shard_lines must be a positive integer, got {shard_lines!r}")
    root, files = find_inputs(spec, suffixes)
    output_dir = Path(os.path.abspath(output_dir))
    real_output = output_dir.resolve()
    if Path(str(spec)).expanduser().is_dir() and (
        real_output == root or root in real_output.parents
    ):
        raise ValueError(f"output folder {output_dir} is inside the input folder {root}")
    seen: dict[Path, Path] = {}
    outputs: dict[Path, Path] = {}
    inputs = []
    for path in files:
        real = path.resolve()
        if real == real_output or real_output in real.parents:
            raise ValueError(f"input {path} is inside the output folder {output_dir}")
        if real in seen:
            raise ValueError(f"input {path} is named twice: it is the same file as {seen[real]}")
        seen[real] = path
        rel = _relative(path, root)
        output_rel = rel.with_suffix(output_suffix)
        if output_rel in outputs:
            raise ValueError(
                f"inputs {outputs[output_rel]} and {path} would both write "
                f"{output_dir / output_rel}; rename one"
            )
        outputs[output_rel] = path
        key = text_key if path.suffix == ".jsonl" else None
        inputs.append(scan(path, rel, output_rel, shard_lines, key))
    return inputs


def scan(
    path: Path, rel: Path, output_rel: Path, shard_lines: int, text_key: Optional[str] = None
) -> InputFile:
    """Read `path` once: sha256, lines, shard offsets; ValueError if unreadable, empty or bad."""
    digest = hashlib.sha256()
    try:
        size = path.stat().st_size
        if path.suffix == ".spacy":
            return _scan_docbin(path, rel, output_rel, size, shard_lines)
        offsets = []
        lines = 0
        position = 0
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                digest.update(raw)
                text = raw[3:] if number == 1 and raw.startswith(b"\xef\xbb\xbf") else raw
                try:
                    decoded = text.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"input file {path}, line {number}: not UTF-8 text ({err.reason} at "
                        f"byte {err.start})"
                    ) from None
                if text_key is not None:
                    if not decoded.strip():
                        position += len(raw)
                        continue
                    _check_json_line(path, number, decoded, text_key)
                if lines % shard_lines == 0:
                    offsets.append(position)
                lines += 1
                position += len(raw)
    except OSError as err:
        raise ValueError(f"input file {path} cannot be read: {err.strerror or err}") from None
    if lines == 0:
        raise ValueError(f"input file {path} is empty")
    return InputFile(
        path, rel, output_rel, digest.hexdigest(), lines, size, tuple(offsets), shard_lines
    )


def _scan_docbin(path: Path, rel: Path, output_rel: Path, size: int, shard_lines: int) -> InputFile:
    """A DocBin is one shard (its documents cannot be read from an offset)."""
    from spacy.tokens import DocBin

    data = path.read_bytes()
    try:
        count = len(DocBin().from_bytes(data))
    except Exception as err:  # noqa: BLE001 - any failure to parse is a bad input
        raise ValueError(f"input file {path} is not a spaCy DocBin ({err})") from None
    if count == 0:
        raise ValueError(f"input file {path} is empty (a DocBin without documents)")
    return InputFile(
        path,
        rel,
        output_rel,
        hashlib.sha256(data).hexdigest(),
        count,
        size,
        (0,),
        max(count, shard_lines),
    )


def _check_json_line(path: Path, number: int, line: str, text_key: str) -> None:
    try:
        record = json.loads(line)
    except ValueError as err:
        raise ValueError(f"input file {path}, line {number}: not JSON ({err})") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
        raise ValueError(
            f"input file {path}, line {number}: no string under the text key {text_key!r}"
        )


def _fixed_part(pattern: str) -> Path:
    """The folder before the first component of `pattern` with a wildcard."""
    parts = []
    for part in Path(pattern).expanduser().parts:
        if glob.has_magic(part):
            break
        parts.append(part)
    return Path(os.path.abspath(Path(*parts))) if parts else Path.cwd()


def _relative(path: Path, root: Path) -> Path:
    try:
        return path.relative_to(root)
    except ValueError:
        return path.resolve().relative_to(root)
