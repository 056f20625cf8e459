"""`spacy project run evidence-report` works on a fresh clone: everything it needs is in git,
and from results/ alone it writes the report that is committed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import srsly
from weasel.util import substitute_project_variables

REPO = Path(__file__).resolve().parents[2]


def _command(name: str) -> dict:
    config = substitute_project_variables(srsly.read_yaml(REPO / "project.yml"))
    (command,) = [c for c in config["commands"] if c["name"] == name]
    return command


def _tracked(path: str) -> bool:
    result = subprocess.run(
        ["git", "ls-files", "--", path], cwd=REPO, capture_output=True, text=True, check=True
    )
    return bool(result.stdout.strip())


def test_evidence_report_needs_only_what_git_holds():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    command = _command("evidence-report")
    missing = [dep for dep in command["deps"] if not _tracked(dep)]
    assert not missing, f"a fresh clone lacks {missing}: spacy project would refuse to run"
    # the runs under training/evidence are no dependency, so it must not skip when they change
    assert command.get("no_skip") is True


@pytest.mark.slow
def test_evidence_report_remakes_the_committed_report_from_results(tmp_path):
    """The script line, run where there is no training/ folder, writes results/evidence.json
    and .md equal to the committed ones."""
    (line,) = _command("evidence-report")["script"]
    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "workflow.evidence"]
    shutil.copytree(REPO / "results", tmp_path / "results")
    for path in ("README.md", "docs/learning-curves.md",
                 "spacy_elmo/data/en_elmo_bundled/pretrain.json"):  # fmt: skip
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "training").exists()
    for path in ("results/evidence.json", "results/evidence.md", "docs/learning-curves.md"):
        assert (tmp_path / path).read_text() == (REPO / path).read_text(), path
    assert (tmp_path / "docs" / "evidence.png").stat().st_size > 10_000
