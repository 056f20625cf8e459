"""The driver of a corpus run (`embed-corpus`, `apply`), and OUTPUT_DIR's own files: lock,
skip what the manifest has, shard the rest, record results.

manifest.jsonl: one JSON line per finished output, appended when it is whole; a re-run skips an
output recorded with the same input, model and options whose file is unchanged. A long file's
parts go to `.NAME.<suffix>.parts-<key>/` beside its output (the key names input, model and
options) and are joined when the last is done. Temporary files, `.NAME.spacy-elmo-tmp-XXXXXXXX`,
are named so that a run removes only its own: a name of this family for a file NAME that the
run itself writes there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import time
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..util.files import LockHeld, atomic_path, file_sha256, fsync_directory, lock_file, printable
from .engine import Cluster, Job, RunStats, Task, run_tasks
from .plan import InputFile

LOCK_NAME = ".spacy-elmo.lock"
MANIFEST_NAME = "manifest.jsonl"
PARTS_MARK = ".parts-"
# A folder of parts beside output NAME: .NAME<PARTS_MARK>KEY (`parts_dir`).
PARTS_FOLDER = re.compile(r"^\.(?P<name>.+)" + re.escape(PARTS_MARK) + "[0-9a-f]{16}$", re.DOTALL)
# A part's name in its folder: FIRST-COUNT<suffix> (FIRST: the range's first line, 0-based).
PART_NAME = re.compile(r"^[0-9]{12}-[0-9]+\.[a-z0-9]+$")
MARK = ".spacy-elmo-tmp-"
# `.NAME<MARK>XXXXXXXX` (the staged file) or `..NAME<MARK>XXXXXXXX.YYYYYYYY.tmp` (mkstemp's
# temporary file of atomic_path, 8 characters of [a-z0-9_]; `.probe`: check_output's probe).
_OWNED = re.compile(
    r"^\.(?P<inner>\.)?(?P<name>.+)"
    + re.escape(MARK)
    + r"[0-9a-f]{8}(?(inner)\.[a-z0-9_]{8}\.(?:tmp|probe))$",
    re.DOTALL,
)
# What a record must hold to be read: the fields a re-run compares, with their JSON types.
RECORD_FIELDS = {
    "output": str,
    "input_sha256": str,
    "model": dict,
    "options": dict,
    "bytes": int,
    "mtime_ns": int,
}


class ManifestWarning(UserWarning):
    """A line of the manifest that was ignored: the last one, cut short by a killed run."""


@dataclass
class CorpusResult:
    """What a run did: outputs written and skipped, and Ray's measurements (`stats.lines`: the
    lines run this time, parts reused from an interrupted run not counted; `stats.failures`)."""

    written: list[str] = field(default_factory=list)  # output paths relative to OUTPUT_DIR
    skipped: list[str] = field(default_factory=list)
    stats: Optional[RunStats] = None  # None when there was nothing to run (Ray not started)


class CorpusRunError(ValueError):
    """Some shards failed; the other outputs are whole and recorded. `result` says which."""

    def __init__(self, result: CorpusResult) -> None:
        self.result = result
        failures = result.stats.failures
        name, why = failures[0]
        super().__init__(
            f"{len(failures)} shard(s) failed, first {name}: {why}; the "
            f"{len(result.written)} other outputs written are whole; re-run to retry"
        )


def run_corpus(
    command: str,
    inputs: list[InputFile],
    output_dir: Path,
    job: Job,
    model: dict[str, Any],
    cluster: Cluster,
    progress: bool = True,
) -> CorpusResult:
    """Run `job` over every input not yet done; raise CorpusRunError if a shard failed."""
    output_dir = Path(output_dir).absolute()
    options = job.options()
    result = CorpusResult()
    with warnings.catch_warnings():  # said when it is read again, under the lock
        warnings.simplefilter("ignore", ManifestWarning)
        _check_replaceable(output_dir, inputs, read_manifest(output_dir))
    with output_lock(output_dir, command):
        records = read_manifest(output_dir)  # before anything is written: it may be refused
        parts_dirs = {item: parts_dir(output_dir, item, model, options) for item in inputs}
        _remove_temporary_files(output_dir, inputs, set(parts_dirs.values()))
        compact_manifest(output_dir, records)
        tasks: list[Task] = []
        remaining_parts: dict[Path, int] = {}
        joins: dict[Path, Task] = {}
        by_output: dict[Path, InputFile] = {}
        for item in inputs:
            output = output_dir / item.output_rel
            folder = parts_dirs[item]
            if is_done(
                records.get(item.output_rel.as_posix()), output_dir, item.sha256, model, options
            ):
                result.skipped.append(item.output_rel.as_posix())
                continue
            by_output[output] = item
            if len(item.shards) == 1:
                payload = {"kind": "whole", "input": str(item.path), "output": str(output)}
                tasks.append(Task(printable(item.path), item.lines, payload))
                continue
            parts = [folder / f"{r.first:012d}-{r.count}{output.suffix}" for r in item.shards]
            join = Task(
                f"{printable(item.path)} (joining {len(parts)} parts)",
                0,
                {"kind": "join", "parts": [str(p) for p in parts], "output": str(output)},
            )
            todo = [(r, p) for r, p in zip(item.shards, parts) if not p.exists()]
            if not todo:
                tasks.append(join)
                continue
            joins[folder] = join
            remaining_parts[folder] = len(todo)
            for r, part in todo:
                payload = {"kind": "part", "input": str(item.path), "output": str(part), "range": r}
                name = f"{printable(item.path)} lines {r.first + 1}-{r.first + r.count}"
                tasks.append(Task(name, r.count, payload))
        if not tasks:
            return result

        def on_done(task: Task, outcome: dict[str, Any]) -> list[Task]:
            output = Path(task.payload["output"])
            if task.payload["kind"] == "part":
                remaining_parts[output.parent] -= 1
                return [joins.pop(output.parent)] if remaining_parts[output.parent] == 0 else []
            item, stage = by_output[output], Path(outcome["staged"])
            record = make_record(item, stage, outcome["lines"], model, options, outcome["sha256"])
            append_record(output_dir, record)  # recorded, then installed
            install(stage, output)
            result.written.append(item.output_rel.as_posix())
            if task.payload["kind"] == "join":
                _remove_parts(Path(task.payload["parts"][0]).parent)
            return []

        try:
            result.stats = run_tasks(job, tasks, cluster, on_done, progress, description=command)
        finally:
            # A worker ended with the run (Ctrl-C, SIGTERM, an error) never finishes the file it
            # was writing: remove it while this run still holds the folder's lock.
            _remove_temporary_files(output_dir, inputs, set(parts_dirs.values()))
    if result.stats.failures:
        raise CorpusRunError(result)
    return result


@contextmanager
def output_lock(output_dir: Path, command: str) -> Iterator[Path]:
    """Hold OUTPUT_DIR's lock (flock, released when its holder ends however it ends) for the
    block; ValueError naming the holder if another run has it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_NAME
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        lock = lock_file(path, json.dumps(holder) + "\n")
    except LockHeld as held:
        raise ValueError(
            f"output folder {output_dir} is in use by another run ({_describe(held.text)}); "
            "wait for it to end or choose another output folder"
        ) from None
    with lock:
        yield path


def _describe(text: str) -> str:
    try:
        holder = json.loads(text)
        return (
            f"`spacy-elmo {holder['command']}`, pid {holder['pid']} on {holder['host']} "
            f"since {holder['since']}"
        )
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def _check_replaceable(output_dir: Path, inputs: list[InputFile], records: dict) -> None:
    """ValueError naming the first output whose place holds something that the manifest does
    not record (a run replaces only its own outputs)."""
    for item in inputs:
        output = output_dir / item.output_rel
        if item.output_rel.as_posix() not in records and (output.exists() or output.is_symlink()):
            raise ValueError(
                f"output {printable(output)} exists and {MANIFEST_NAME} does not record it: a "
                "run replaces only the outputs it wrote; move it away or choose another output "
                "folder"
            )


def parts_dir(output_dir: Path, item: InputFile, model: dict, options: dict) -> Path:
    """The folder of parts of `item`'s output: .NAME<PARTS_MARK>KEY beside it, KEY a short name
    for (input, model, options), so that only parts of the same work are joined."""
    output = output_dir / item.output_rel
    text = json.dumps([item.sha256, model.get("sha256"), options], sort_keys=True)
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return output.parent / f".{output.name}{PARTS_MARK}{key}"


def _remove_temporary_files(output_dir: Path, inputs: list[InputFile], parts: set[Path]) -> None:
    """Remove the temporary files (`owned_name`) made, by this run or an interrupted one, for the
    files this run writes (its outputs, the manifest; in its folders of parts `parts`, any), and
    its outputs' other folders of parts (of another input, model or options): one scan of each
    folder."""
    names: dict[Path, set[str]] = {output_dir: {MANIFEST_NAME}}
    for item in inputs:
        output = output_dir / item.output_rel
        names.setdefault(output.parent, set()).add(output.name)
    for folder, wanted in names.items():
        for entry in folder_entries(folder):
            found = PARTS_FOLDER.match(entry.name)
            if owned_name(entry.name) in wanted and entry.is_file(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)
            elif found and found["name"] in wanted and entry.is_dir(follow_symlinks=False):
                _remove_parts(Path(entry.path), keep_parts=Path(entry.path) in parts)


def _remove_parts(folder: Path, keep_parts: bool = False) -> None:
    """Remove the temporary files of a folder of parts and, unless `keep_parts` (the run's own
    folder, whose whole parts it reuses), its parts and the folder if it empties."""
    for entry in folder_entries(folder):
        temporary = owned_name(entry.name) is not None
        part = not keep_parts and PART_NAME.match(entry.name) is not None
        if (temporary or part) and entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)
    if not keep_parts:
        with suppress(OSError):
            folder.rmdir()


def folder_entries(folder: Path) -> list[os.DirEntry]:
    """The entries of `folder`; none where there is no such folder (yet), or not one."""
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


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
