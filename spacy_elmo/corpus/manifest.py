"""OUTPUT_DIR's own files. manifest.jsonl: one JSON line per finished output, appended when it
is whole; a re-run skips an output recorded with the same input, model and options whose file
is unchanged. Temporary files, `.NAME.spacy-elmo-tmp-XXXXXXXX`, named so that a run removes
only its own: a name of this family for a file NAME that the run itself writes there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
import warnings
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable, Optional

from ..util.files import atomic_path, file_sha256, fsync_directory, printable
from .plan import InputFile

MANIFEST_NAME = "manifest.jsonl"


class ManifestWarning(UserWarning):
    """A line of the manifest that was ignored: the last one, cut short by a killed run."""


# What a record must hold to be read: the fields a re-run compares, with their JSON types.
RECORD_FIELDS = {
    "output": str,
    "input_sha256": str,
    "model": dict,
    "options": dict,
    "bytes": int,
    "mtime_ns": int,
}


def read_manifest(output_dir: Path) -> dict[str, dict[str, Any]]:
    """The latest record of each output (by its path relative to OUTPUT_DIR).

    A last line cut short by a killed run is ignored with a ManifestWarning; any other line that
    is not a record (RECORD_FIELDS) is a ValueError naming the manifest and the line.
    """
    path = output_dir / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    records: dict[str, dict[str, Any]] = {}
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        record, problem = _parse_record(raw)
        if problem is None:
            records[record["output"]] = record
        elif number == len(lines):  # no newline after it: cut short
            warnings.warn(
                f"manifest {printable(path)}, line {number}: ignored, a last line cut short "
                f"({problem}); the output it was recording, if any, is done again",
                ManifestWarning,
                stacklevel=2,
            )
        else:
            raise ValueError(
                f"manifest {printable(path)}, line {number}: not a record of spacy-elmo "
                f"({problem}); remove that line (its output is then done again) or choose "
                "another output folder"
            )
    return records


def _parse_record(raw: bytes) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(the record, None) or (None, what is wrong with the line)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8: {err.reason} at byte {err.start}"
    try:
        record = json.loads(text)
    except ValueError as err:
        return None, f"not JSON: {err}"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    for name, kind in RECORD_FIELDS.items():
        value = record.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            found = "missing" if name not in record else f"a {type(value).__name__}"
            return None, f"its {name!r} is {found}, not a {kind.__name__}"
    return record, None


def record_line(record: dict[str, Any]) -> bytes:
    """The manifest line of `record`, UTF-8: the bytes of a file name that is not UTF-8
    (surrogate escapes) as JSON escapes (`\\udcff` for byte 0xff), which read back the same."""
    return json.dumps(record, ensure_ascii=False).encode("utf-8", "backslashreplace") + b"\n"


def compact_manifest(output_dir: Path, records: dict[str, dict[str, Any]]) -> None:
    """Rewrite the manifest with only the latest record of each output (atomically)."""
    manifest = output_dir / MANIFEST_NAME
    if records or manifest.exists():
        stage = stage_name(manifest)
        with atomic_path(stage) as tmp:
            tmp.write_bytes(b"".join(record_line(r) for r in records.values()))
        install(stage, manifest)


def append_record(output_dir: Path, record: dict[str, Any]) -> None:
    """Append one record and make it durable; a write or sync that fails (a full disk, a signal)
    cuts the manifest back to where it was."""
    data = record_line(record)
    fd = os.open(output_dir / MANIFEST_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            with suppress(OSError):  # else the next run ignores a cut last line
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def make_record(
    item: InputFile,
    written: Path,
    lines: int,
    model: dict[str, Any],
    options: dict[str, Any],
    output_sha256: str,
) -> dict[str, Any]:
    """The record of `item`'s finished output, `written` under its temporary name (its size and
    mtime, read now, are the output's once it is installed)."""
    stat = written.stat()
    return {
        "output": item.output_rel.as_posix(),
        "input": str(item.path),
        "input_sha256": item.sha256,
        "lines": lines,
        "model": model,
        "options": options,
        "output_sha256": output_sha256,
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def is_done(
    record: Optional[dict[str, Any]],
    output_dir: Path,
    input_sha256: str,
    model: dict[str, Any],
    options: dict[str, Any],
) -> bool:
    """Whether the output of `record` is whole and was made from this input, model, options."""
    if (
        record is None
        or record.get("input_sha256") != input_sha256
        or record.get("model", {}).get("sha256") != model.get("sha256")
        or record.get("options") != options
    ):
        return False
    try:
        stat = (output_dir / record["output"]).stat()
    except OSError:
        return False
    return stat.st_size == record.get("bytes") and stat.st_mtime_ns == record.get("mtime_ns")


def work_key(input_sha256: str, model: dict[str, Any], options: dict[str, Any]) -> str:
    """A short name for (input, model, options): the parts of one output share it."""
    text = json.dumps([input_sha256, model.get("sha256"), options], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


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


def stage_name(path: Path) -> Path:
    """A temporary name beside `path`, of the family that `owned_name` knows."""
    return path.parent / f".{path.name}{MARK}{secrets.token_hex(4)}"


def install(stage: Path, path: Path) -> None:
    """Rename the whole file `stage` over `path`, durably."""
    os.replace(stage, path)
    fsync_directory(path.parent)


def write_output(payload: dict, write: Callable[[Path], int]) -> dict:
    """A shard's output written whole by `write(stage)` (which returns its lines) under a stage
    name, then installed (a part) or left for the driver to install once recorded (an output);
    the worker's report: the lines, and for an output, its stage and sha256."""
    output = Path(payload["output"])
    stage = stage_name(output)
    lines = write(stage)
    if payload["kind"] != "part":
        return {"lines": lines, "staged": str(stage), "sha256": file_sha256(stage)}
    install(stage, output)
    return {"lines": lines}
