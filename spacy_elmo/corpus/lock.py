"""One run per output folder at a time: an advisory lock the kernel drops when its holder dies."""

from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..util.files import LockHeld, lock_file

LOCK_NAME = ".spacy-elmo.lock"


@contextmanager
def output_lock(output_dir: Path, command: str) -> Iterator[Path]:
    """Hold OUTPUT_DIR's lock for the block; ValueError naming the holder if another run has it.

    flock(2) is released by the kernel when the holding process ends, however it ends: the lock
    file a killed run leaves behind is not a held lock, and the next run takes it over.
    """
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
