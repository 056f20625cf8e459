"""What .ci/run runs holds on a checkout that a user has worked in: `ruff check .` with the
project's settings skips the folders that the workflows and usage.md's shipping recipe write
(`spacy package` writes a setup.py that ruff would flag), and still checks the rest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
FLAGGED = "import os\n"  # F401: imported but unused


def ruff_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ruff_skips_what_the_recipes_write(tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in ("packages/en_elmo_demo-1.0.0", "dist", "wheelhouse", "training", "assets"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "setup.py").write_text(FLAGGED)
    assert ruff_check(tmp_path).returncode == 0, ruff_check(tmp_path).stdout
    (tmp_path / "mine.py").write_text(FLAGGED)
    done = ruff_check(tmp_path)
    assert done.returncode == 1 and "mine.py" in done.stdout and "setup.py" not in done.stdout


def test_ci_makes_a_fresh_venv_and_pins_torch():
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "mktemp -d" in script and "-m venv" in script
    assert "pip install -q torch==2.13.0\n" in script
    assert "--index-url" not in script
    assert "python -m pytest\n" in script  # the README's test command
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "python -m pytest " in readme
