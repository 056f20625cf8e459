"""`--address` / RAY_ADDRESS where no Ray cluster answers: an error naming it, in bounded time.

The checks of the address itself need no Ray; the command and the real cluster run inside a
private network namespace (`unshare --net`), as every test that starts Ray does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spacy_elmo.corpus.engine import check_ray_address, connect_timeout

REPO = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def in_namespace(script: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs `unshare` and `ip` (util-linux, iproute2) for a private network")
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a private network namespace")
    command = [*prefix, "sh", "-c", f"ip link set lo up && {script}"]
    environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **env}
    if "RAY_ADDRESS" not in env:
        environment.pop("RAY_ADDRESS", None)
    return subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=timeout
    )


def test_a_port_nothing_listens_on_is_named_at_once():
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"cannot join the Ray cluster at {address}: .*refused"):
        check_ray_address(address)
    assert time.monotonic() - start < 5
    with pytest.raises(ValueError, match=rf"at ray://{address}: "):
        check_ray_address(f"ray://{address}")


def test_a_port_that_accepts_but_never_answers_errs_after_the_timeout(monkeypatch):
    monkeypatch.setenv("SPACY_ELMO_RAY_CONNECT_TIMEOUT", "0.5")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"at {address}: .*nothing answered .* within 0.5s"):
            check_ray_address(address)
        assert 0.4 < time.monotonic() - start < 5


def test_the_timeout_is_configurable(monkeypatch):
    monkeypatch.delenv("SPACY_ELMO_RAY_CONNECT_TIMEOUT", raising=False)
    assert connect_timeout() == 10.0
    monkeypatch.setenv("SPACY_ELMO_RAY_CONNECT_TIMEOUT", "2.5")
    assert connect_timeout() == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv("SPACY_ELMO_RAY_CONNECT_TIMEOUT", bad)
        with pytest.raises(ValueError, match=rf"SPACY_ELMO_RAY_CONNECT_TIMEOUT='{bad}' is not"):
            connect_timeout()


@pytest.mark.parametrize("how", ["--address", "RAY_ADDRESS"])
def test_embed_corpus_with_no_cluster_at_the_address_errs_naming_it(
    how, tmp_path, allennlp_fixture
):
    (tmp_path / "in.txt").write_text("The river bank .\n", encoding="utf-8")
    port = 6399  # in a namespace of its own nothing listens anywhere
    address = f"127.0.0.1:{port}"
    arguments = [
        sys.executable, "-m", "spacy_elmo.cli", "embed-corpus",
        str(tmp_path / "in.txt"), str(tmp_path / "out"), "-q",
        "--options", str(allennlp_fixture / "options.json"),
        "--weights", str(allennlp_fixture / "lm_weights.hdf5"),
    ]  # fmt: skip
    env = {"SPACY_ELMO_RAY_CONNECT_TIMEOUT": "3"}
    if how == "--address":
        arguments += ["--address", address]
    else:
        env["RAY_ADDRESS"] = address
    start = time.monotonic()
    try:
        done = in_namespace(" ".join(f"'{a}'" for a in arguments), env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"embed-corpus {how} {address} still waits after 120 s")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"error: cannot join the Ray cluster at {address}" in done.stderr
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_a_running_cluster_passes_the_check(tmp_path):
    pytest.importorskip("ray")
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import logging, ray\n"
        "from spacy_elmo.corpus.engine import check_ray_address\n"
        "ray.init(address='local', num_cpus=1, include_dashboard=False,\n"
        "         _node_ip_address='127.0.0.1', logging_level=logging.ERROR)\n"
        "try:\n"
        "    check_ray_address(ray.get_runtime_context().gcs_address)\n"
        "    print('answered')\n"
        "finally:\n"
        "    ray.shutdown()\n",
        encoding="utf-8",
    )
    done = in_namespace(f"'{sys.executable}' '{probe}'", {}, timeout=180)
    assert done.returncode == 0 and "answered" in done.stdout, done.stdout + done.stderr


PROBE_LINE = (
    b"[2026-01-01 00:00:00,000 W 1 1] network_util.cc:330: Failed to determine local IP via "
    b"external connectivity to: 8.8.8.8:53, falling back to hostname resolution\n"
)


class RayThatProbes:
    """Stands in for the `ray` module: its `init` writes Ray's IP probe line and another line
    to file descriptor 2, as Ray's C++ code does, then finds no cluster; `shutdown` (the
    cleanup after any start, failed or not) has nothing to end."""

    @staticmethod
    def init(**_):
        os.write(2, PROBE_LINE + b"another line from ray.init\n")
        raise ConnectionError("no cluster here")

    @staticmethod
    def shutdown():
        pass


@pytest.mark.parametrize("progress", [False, True], ids=["quiet", "with progress"])
def test_rays_log_lines_are_dropped_and_nothing_else(monkeypatch, capfd, progress):
    """With or without --quiet (as `embed` prints nothing of the kind)."""
    from spacy_elmo.corpus import engine

    monkeypatch.setattr(engine, "require_ray", lambda: RayThatProbes)
    monkeypatch.setattr(engine, "check_ray_address", lambda address: None)
    cluster = engine.Cluster(address="127.0.0.1:6399")
    with pytest.raises(ValueError, match="cannot join the Ray cluster at 127.0.0.1:6399"):
        engine.run_tasks(None, [], cluster, lambda task, result: [], progress=progress)
    err = capfd.readouterr().err
    assert "another line from ray.init" in err
    assert "network_util.cc" not in err


def test_the_lines_dropped_are_those_ray_writes():
    """Ray's own IP probe, where nothing outside answers (a private network namespace), writes
    lines that the filter drops; the other lines written at the same time pass."""
    pytest.importorskip("ray")
    script = (
        "import os, sys\n"
        "from ray._common.network_utils import node_ip_address_from_perspective\n"
        "from spacy_elmo.corpus.engine import _ray_lines_dropped\n"
        "with _ray_lines_dropped() if sys.argv[1] == 'dropped' else open(os.devnull):\n"
        "    node_ip_address_from_perspective()\n"
        "    os.write(2, b'another line\\n')\n"
    )
    runs = {
        how: in_namespace(f"'{sys.executable}' -c \"{script}\" {how}", {}, timeout=120)
        for how in ("loud", "dropped")
    }
    for done in runs.values():
        assert done.returncode == 0 and "another line" in done.stderr, done.stderr
    if "network_util.cc" not in runs["loud"].stderr:
        pytest.skip(f"this Ray writes no IP probe line: {runs['loud'].stderr!r}")
    assert "network_util.cc" not in runs["dropped"].stderr, runs["dropped"].stderr
