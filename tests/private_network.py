"""A command's prefix that runs it in a private network namespace with only its loopback up: Ray
binds the interface address even when told 127.0.0.1, so its tests run where no address but
127.0.0.1 exists."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def private_network() -> tuple[str, ...]:
    """`unshare --net` (as root, else with a mapped root user), then `ip link set lo up`; the
    command given after the prefix is exec'd, so the process signalled is the command itself.
    Skips the test where no such namespace can be made."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs `unshare` and `ip` (util-linux, iproute2) for a private network")
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    probe = subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private network namespace: {probe.stderr.decode().strip()}")
    return (*prefix, "sh", "-c", 'ip link set lo up && exec "$@"', "sh")
