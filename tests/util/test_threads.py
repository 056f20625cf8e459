"""torch's CPU threads (util/threads.py): the CPUs a process may use, the one function that sets
the threads (and that every part of spacy-elmo calls), and its warning."""

from __future__ import annotations

import ast
import os
import warnings
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.util import threads as cpu_threads
from spacy_elmo.util.threads import (
    ThreadsWarning,
    cgroup_cpu_quota,
    usable_cpus,
    use_threads,
)

from ..pretrain.test_pretrain import cli_args, tiny_config, write_corpus

PACKAGE = Path(__file__).resolve().parents[2] / "spacy_elmo"


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


@pytest.fixture()
def two_threads(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_warned", False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_message_names_both_counts_and_the_remedy(tmp_path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    if usable_cpus(tmp_path / "none")[0] < 2:
        pytest.skip("this process may run on one core only: the quota limits nothing")
    with pytest.warns(ThreadsWarning) as caught:
        assert cpu_threads.thread_count(8) == 8
    message = str(caught[0].message)
    assert "torch runs 8 CPU threads" in message and "only 1 at once" in message
    assert "quota of 1 CPUs" in message and "torch.set_num_threads(1)" in message
    assert "docs/performance.md#threads-on-a-shared-machine" in message


def test_the_component_takes_the_usable_cpus_and_warns_once_beyond_them(
    tmp_path: Path, monkeypatch, two_threads
):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadsWarning)
        assert cpu_threads.bilm_threads(None) == 1  # torch's 2, lowered to the quota's 1
        assert cpu_threads.bilm_threads(None, overlapped=True) == 0  # no core to spare
    with pytest.warns(ThreadsWarning, match="torch runs 2 CPU threads.*only 1 at once"):
        assert cpu_threads.bilm_threads(2) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadsWarning)
        assert cpu_threads.bilm_threads(2) == 2  # once per process


def test_the_bilm_trains_on_one_thread_unless_its_setting_says_otherwise(two_threads):
    """Beside other work torch's threads wait on each other (spacy train 10x slower:
    docs/performance.md#threads-on-a-shared-machine); prediction keeps torch's count."""
    assert cpu_threads.bilm_threads(None, training=True) == 1
    assert cpu_threads.bilm_threads(2, training=True) == 2
    assert cpu_threads.bilm_threads(None) == min(2, usable_cpus()[0])


def test_a_forked_child_takes_one_thread_whatever_the_setting(monkeypatch):
    """The OpenMP pool of the parent does not survive `fork` (`nlp.pipe(n_process=N)`)."""
    monkeypatch.setattr(cpu_threads, "_IMPORTED_IN", os.getpid() + 1)
    assert cpu_threads.thread_count(None) == cpu_threads.thread_count(4) == 1


def test_no_warning_without_a_limit(tmp_path: Path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "max 100000"))
    if usable_cpus(tmp_path)[0] < 2:
        pytest.skip("this process may run on one core only")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadsWarning)
        assert use_threads(2) == 2
    assert not cpu_threads._warned


def test_by_default_the_threads_are_lowered_to_the_usable_cpus(tmp_path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadsWarning)
        assert use_threads(None) == 1
    assert torch.get_num_threads() == 1 and not cpu_threads._warned


def test_a_count_beyond_the_cpus_is_kept_and_warned_about_once(tmp_path, monkeypatch, two_threads):
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path, "100000 100000"))
    with pytest.warns(ThreadsWarning, match="runs 2 .*only 1 at once.*--threads-per-worker 1"):
        assert use_threads(2, "--threads-per-worker") == 2
    assert torch.get_num_threads() == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThreadsWarning)
        use_threads(2)  # once per process
        use_threads(1)  # one thread always fits


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_count_that_is_not_a_positive_integer_is_named(bad):
    with pytest.raises(ValueError, match=f"--threads must be a positive integer, got {bad!r}"):
        use_threads(bad, "--threads")


# ---------------------------------------------------------------------- one place
def test_only_util_threads_sets_torchs_threads():
    """torch.set_num_threads (and set_num_interop_threads) appear in util/threads.py only."""
    setters = ("set_num_threads", "set_num_interop_threads")
    callers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr in setters
    )
    assert set(callers) == {"util/threads.py"}


class Stopped(ValueError):
    """Raised by the recording `use_threads`: the entry point got as far as its threads."""


@pytest.fixture()
def calls(monkeypatch) -> list[tuple]:
    """The calls of `use_threads`, which stops each caller there."""
    made: list[tuple] = []

    def record(threads, what="--threads"):
        made.append((threads, what))
        raise Stopped("stopped at the threads")

    monkeypatch.setattr(cpu_threads, "use_threads", record)
    return made


def invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(
    "command, given, expected",
    [
        (["embed", "{tmp}/in.txt", "{tmp}/out.hdf5"], [], None),
        (["embed", "{tmp}/in.txt", "{tmp}/out.hdf5"], ["-t", "3"], 3),
        (["perplexity", "{tmp}/in.txt"], ["--threads", "2"], 2),
        (["perplexity", "{tmp}/in.txt"], [], None),
        (["probe", "{tmp}/probe"], [], 1),  # probe's default: one thread, as its help says
    ],
)
def test_every_command_sets_its_threads_through_use_threads(
    tmp_path, monkeypatch, calls, command, given, expected
):
    from spacy_elmo import probes

    monkeypatch.setattr(probes, "check_assets", lambda *args: None)
    (tmp_path / "in.txt").write_text("a line .\n", encoding="utf-8")
    result = invoke(*[arg.format(tmp=tmp_path) for arg in command], *given)
    assert result.exit_code == 1 and "error: stopped at the threads" in result.output
    assert calls == [(expected, "--threads")]


def test_pretrain_sets_its_threads_through_use_threads(tmp_path, calls):
    corpus = write_corpus(tmp_path / "corpus.txt")
    args = cli_args(corpus, tmp_path / "run")
    args[args.index("--threads") + 1] = "2"
    result = invoke("pretrain", *args)
    assert result.exit_code == 1 and "error: stopped at the threads" in result.output
    assert calls == [(2, "--threads")]


def test_corpus_workers_set_their_threads_through_use_threads(calls):
    from spacy_elmo.corpus.engine import CorpusWorker

    with pytest.raises(Stopped):
        CorpusWorker(None, 3, 0.0)
    assert calls == [(3, "--threads-per-worker")]


def test_probes_help_says_the_default_that_probe_has():
    (option,) = [
        p for p in typer.main.get_command(app).commands["probe"].params if p.name == "threads"
    ]
    assert option.default == 1 and option.show_default is not False
    assert "default" not in option.help  # the one default shown is typer's: [default: 1]
    shown = invoke("probe", "--help").output
    assert "[default: 1]" in " ".join(shown.split())


def test_pretrain_warns_about_threads_beyond_the_cpus(tmp_path, monkeypatch, two_threads):
    from spacy_elmo.pretrain.trainer import Pretrainer

    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", cgroup_v2(tmp_path / "cg", "100000 100000"))
    corpus = write_corpus(tmp_path / "corpus.txt")
    with pytest.warns(ThreadsWarning, match="torch runs 2 CPU threads.*only 1 at once"):
        trainer = Pretrainer(tiny_config(tmp_path, corpus, threads=2))
    assert trainer.threads == 2 == torch.get_num_threads()
