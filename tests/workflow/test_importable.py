"""The benchmarks and workflow scripts run as modules from the repository root (`python -m
benchmarks.bench_corpus`): none of them edits `sys.path` to find the others."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=")


def path_edits(root: Path) -> list[str]:
    """`file:line` of every sys.path edit in the Python and shell files of the package, the
    benchmarks and the workflow under `root`."""
    found = []
    for folder in ("spacy_elmo", "benchmarks", "workflow"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".sh") and path.is_file():
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    if PATH_EDIT.search(line):
                        found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_no_script_edits_sys_path(tmp_path):
    assert path_edits(REPO) == []
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.sh").write_text(
        'python -c "import sys\nsys.path' + ".insert(0, 'x')\"\n"
    )
    assert path_edits(tmp_path) == ["benchmarks/b.sh:2"]  # the check finds one


def test_bench_corpus_runs_as_a_module():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_corpus", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--sentences" in done.stdout


def test_bench_pretrain_without_its_corpus_says_where_it_comes_from(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_pretrain", str(tmp_path / "dev.txt")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"bench_pretrain.py: error: argument corpus: {tmp_path / 'dev.txt'}")
    assert "`spacy project run pretrain-default`" in last and "examples/train.txt" in last
