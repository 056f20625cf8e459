"""OUTPUT_DIR/manifest.jsonl: one JSON line per finished output, appended when it is whole.

A record names the output, its input (path, sha256, lines), the model's identity, the options
that change the numbers, and the output's sha256, size and modification time. A re-run skips
an output whose latest record has the same input sha256, model and options and whose file still
has the recorded size and modification time (so that a re-run does not read every output
again); anything else is redone. Only the run holding the folder's lock writes the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

MANIFEST_NAME = "manifest.jsonl"


def read_manifest(output_dir: Path) -> dict[str, dict[str, Any]]:
    """The latest record of each output (by its path relative to OUTPUT_DIR).

    A last line cut short by a killed run is ignored; any other unreadable line is an error.
    """
    path = output_dir / MANIFEST_NAME
    if not path.exists():
        return {}
    records: dict[str, dict[str, Any]] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            records[record["output"]] = record
        except (ValueError, KeyError, TypeError):
            if number >= len(lines) - 1:  # the last line, cut short
                continue
            raise ValueError(f"manifest {path}, line {number}: not a record") from None
    return records


def compact_manifest(output_dir: Path, records: dict[str, dict[str, Any]]) -> None:
    """Rewrite the manifest with only the latest record of each output (atomically)."""
    from ..atomic_files import write_text

    if records or (output_dir / MANIFEST_NAME).exists():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records.values())
        write_text(output_dir / MANIFEST_NAME, text)


def append_record(output_dir: Path, record: dict[str, Any]) -> None:
    """Append one record and make it durable before the next output is counted done."""
    with open(output_dir / MANIFEST_NAME, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def make_record(
    output_dir: Path,
    output_rel: Path,
    input_path: Path,
    input_sha256: str,
    lines: int,
    model: dict[str, Any],
    options: dict[str, Any],
    output_sha256: str,
) -> dict[str, Any]:
    """The record of a finished output (its size and mtime read now)."""
    stat = (output_dir / output_rel).stat()
    return {
        "output": output_rel.as_posix(),
        "input": str(input_path),
        "input_sha256": input_sha256,
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
    if record is None:
        return False
    if (
        record.get("input_sha256") != input_sha256
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
