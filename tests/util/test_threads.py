"""The check of torch's CPU threads against the CPUs a process may use (util/threads.py)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import spacy
import torch

from spacy_elmo.cli import _util as opt
from spacy_elmo.util import threads as cpu_threads
from spacy_elmo.util.threads import ThreadsWarning, cgroup_cpu_quota, oversubscription, usable_cpus


def cgroup_v2(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(text)
    return root


def cgroup_v1(root: Path, quota: str, period: str, controller: str = "cpu") -> Path:
    (root / controller).mkdir(parents=True, exist_ok=True)
    (root / controller / "cpu.cfs_quota_us").write_text(quota + "\n")
    (root / controller / "cpu.cfs_period_us").write_text(period + "\n")
    return root


def test_the_quota_of_both_cgroup_versions(tmp_path: Path):
    assert cgroup_cpu_quota(cgroup_v2(tmp_path / "a", "max 100000\n")) is None
    assert cgroup_cpu_quota(cgroup_v2(tmp_path / "b", "150000 100000\n")) == 1.5
    assert cgroup_cpu_quota(cgroup_v1(tmp_path / "c", "-1", "100000")) is None
    assert cgroup_cpu_quota(cgroup_v1(tmp_path / "d", "50000", "100000")) == 0.5
    assert cgroup_cpu_quota(cgroup_v1(tmp_path / "e", "400000", "100000", "cpu,cpuacct")) == 4.0
    # unreadable or absent: no limit known, no error
    assert cgroup_cpu_quota(cgroup_v2(tmp_path / "f", "garbage")) is None
    assert cgroup_cpu_quota(tmp_path / "none") is None


def test_a_quota_below_the_cores_limits_the_usable_cpus(tmp_path: Path):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cpus(tmp_path / "none")[0] == cores
    cpus, source = usable_cpus(cgroup_v2(tmp_path / "half", "50000 100000"))
    assert (cpus, source) == (1, "the cgroup's CPU quota of 0.5 CPUs")  # at least one
    assert usable_cpus(cgroup_v2(tmp_path / "big", f"{100000 * (cores + 4)} 100000"))[0] == cores
    if cores > 2:
        assert usable_cpus(cgroup_v2(tmp_path / "q", "250000 100000"))[0] == 2


def test_the_message_names_both_counts_and_the_remedy():
    assert oversubscription(2, 2, "x") is None
    assert oversubscription(1, 4, "x") is None
    message = oversubscription(8, 2, "the cgroup's CPU quota of 2 CPUs")
    assert "torch runs 8 CPU threads" in message and "only 2 at once" in message
    assert "quota of 2 CPUs" in message and "torch.set_num_threads(2)" in message
    assert "docs/performance.md#threads-on-a-shared-machine" in message


@pytest.fixture()
def two_threads(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_warned", False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_component_warns_once_under_a_quota(tmp_path: Path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    nlp = spacy.blank("en")
    with pytest.warns(ThreadsWarning, match="torch runs 2 CPU threads.*only 1 at once"):
        nlp.add_pipe("elmo")
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        nlp.add_pipe("elmo", name="elmo2")
    assert not [w for w in again if issubclass(w.category, ThreadsWarning)]


def test_no_warning_without_a_limit(tmp_path: Path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "max 100000"))
    if usable_cpus(tmp_path)[0] < 2:
        pytest.skip("this process may run on one core only")
    assert cpu_threads.warn_if_oversubscribed() is None
    assert not cpu_threads._warned


def test_the_command_line_warns_without_threads_only(tmp_path: Path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    opt.set_threads(2)  # given by hand: the user's choice, no check
    assert not cpu_threads._warned
    with pytest.warns(ThreadsWarning, match="--threads 1"):
        opt.set_threads(None)
