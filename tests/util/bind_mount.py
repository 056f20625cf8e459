"""A command's prefix that runs it with one folder bind-mounted on another, in a mount namespace
of its own (and a private network, so that a Ray it starts binds nothing but 127.0.0.1): the
same folder reached by a second path that no link or `..` explains."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = 'ip link set lo up && mount --bind "$1" "$2" && shift 2 && exec "$@"'


def bind_mounted(source: Path, target: Path) -> tuple[str, ...]:
    """`unshare --mount --net` (with a mapped root user unless root), `source` bind-mounted on
    the empty folder `target` (made here), then the command given after the prefix, exec'd.
    Skips the test where no such namespace can be made."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs `unshare` and `ip` (util-linux, iproute2) to bind-mount a folder")
    prefix = ["unshare", "--mount", "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    target.mkdir(parents=True, exist_ok=True)
    command = (*prefix, "sh", "-c", SCRIPT, "sh", str(source), str(target))
    probe = subprocess.run([*command, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount a folder here: {probe.stderr.decode().strip()}")
    return command
