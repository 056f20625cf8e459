"""The driver of a corpus run (`embed-corpus`, `apply`): lock, skip what the manifest has, shard
the rest, record results. A long file's parts go to `.NAME.<suffix>.parts-<key>/` beside its
output (the key names input, model and options) and are joined when the last is done.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ..util.files import LockHeld, lock_file, printable
from .engine import Cluster, Job, RunStats, Task, run_tasks
from .manifest import (
    MANIFEST_NAME,
    ManifestWarning,
    append_record,
    compact_manifest,
    install,
    is_done,
    make_record,
    owned_name,
    read_manifest,
    work_key,
)
from .plan import InputFile

LOCK_NAME = ".spacy-elmo.lock"
PARTS_MARK = ".parts-"
# A folder of parts beside output NAME: .NAME<PARTS_MARK>KEY, KEY the output's `work_key`.
PARTS_FOLDER = re.compile(r"^\.(?P<name>.+)" + re.escape(PARTS_MARK) + "[0-9a-f]{16}$", re.DOTALL)
# A part's name in its folder: FIRST-COUNT<suffix> (FIRST: the range's first line, 0-based).
PART_NAME = re.compile(r"^[0-9]{12}-[0-9]+\.[a-z0-9]+$")


@dataclass
class CorpusResult:
    """What a run did: outputs written and skipped, lines embedded, and Ray's measurements."""

    written: list[str] = field(default_factory=list)  # output paths relative to OUTPUT_DIR
    skipped: list[str] = field(default_factory=list)
    lines: int = 0  # lines run this time (parts reused from an interrupted run not counted)
    stats: Optional[RunStats] = None  # None when there was nothing to run (Ray not started)
    failures: list[tuple[str, str]] = field(default_factory=list)


class CorpusRunError(ValueError):
    """Some shards failed; the other outputs are whole and recorded. `result` says which."""

    def __init__(self, result: CorpusResult) -> None:
        self.result = result
        first = result.failures[0]
        super().__init__(
            f"{len(result.failures)} shard(s) failed, first {first[0]}: {first[1]}; the "
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
        parts_dirs = {item: _parts_dir(output_dir, item, model, options) for item in inputs}
        _remove_temporary_files(output_dir, inputs, set(parts_dirs.values()))
        compact_manifest(output_dir, records)
        tasks: list[Task] = []
        remaining_parts: dict[Path, int] = {}
        joins: dict[Path, Task] = {}
        by_output: dict[Path, InputFile] = {}
        for item in inputs:
            output = output_dir / item.output_rel
            parts_dir = parts_dirs[item]
            if is_done(
                records.get(item.output_rel.as_posix()), output_dir, item.sha256, model, options
            ):
                result.skipped.append(item.output_rel.as_posix())
                continue
            by_output[output] = item
            shards = item.shards()
            if len(shards) == 1:
                payload = {"kind": "whole", "input": str(item.path), "output": str(output)}
                tasks.append(Task(printable(item.path), item.lines, payload))
                continue
            parts = [parts_dir / f"{r.first:012d}-{r.count}{output.suffix}" for r in shards]
            join = Task(
                f"{printable(item.path)} (joining {len(parts)} parts)",
                0,
                {"kind": "join", "parts": [str(p) for p in parts], "output": str(output)},
            )
            todo = [(r, p) for r, p in zip(shards, parts) if not p.exists()]
            if not todo:
                tasks.append(join)
                continue
            joins[parts_dir] = join
            remaining_parts[parts_dir] = len(todo)
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
        result.lines = result.stats.lines
        result.failures = result.stats.failures
    if result.failures:
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


def _parts_dir(output_dir: Path, item: InputFile, model: dict, options: dict) -> Path:
    output = output_dir / item.output_rel
    return output.parent / f".{output.name}{PARTS_MARK}{work_key(item.sha256, model, options)}"


def _remove_temporary_files(output_dir: Path, inputs: list[InputFile], parts: set[Path]) -> None:
    """Remove the temporary files (manifest.py) made, by this run or an interrupted one, for the
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
