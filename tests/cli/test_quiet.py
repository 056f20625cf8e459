"""`-q` is quiet: no progress bar and no info lines on any stream, while warnings, errors and the
result stay. Each command runs as a user runs it (a process of its own, or the app for the
probe), on a tiny input; the same run without `-q` shows that what is looked for is there to
be hidden. (embed-corpus and apply: tests/corpus/, whose Ray runs give -q.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from spacy_elmo.cli import app

from ..probes.test_probe import write_assets

ROOT = Path(__file__).resolve().parents[2]
# What a tqdm bar writes: "  45%|████▌     | 9/20 [00:00<00:00, 21.87step/s]"
BAR_MARKS = ("%|", "it/s]", "step/s", "line/s")
SENTENCES = ["the river bank was muddy .", "she paid the bank in cash ."]


def spacy_elmo(*args, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "spacy_elmo.cli", *map(str, args)]
    result = subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return result


def has_bar(text: str) -> bool:
    return any(mark in text for mark in BAR_MARKS)


def test_pretrain_quiet_keeps_the_warning_and_the_result_only(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(SENTENCES * 100) + "\n", encoding="utf-8")
    args = ["pretrain", text, "--preset", "tiny", "--vocab-size", "100", "--min-count", "1"]
    # warmup longer than the run: pretrain warns, which -q keeps
    args += ["--batch-tokens", "256", "--max-steps", "6", "--warmup-steps", "20", "--threads", "1"]

    loud = spacy_elmo(*args, tmp_path / "loud", cwd=tmp_path)
    assert has_bar(loud.stderr), loud.stderr

    quiet = spacy_elmo(*args, tmp_path / "quiet", "-q", cwd=tmp_path)
    for stream in (quiet.stdout, quiet.stderr):
        assert not has_bar(stream) and "INFO" not in stream, stream
    assert [line for line in quiet.stderr.splitlines() if line.strip()] == [
        line for line in loud.stderr.splitlines() if line.startswith("WARNING")
    ]
    assert "warmup_steps=20 is longer than max_steps=6" in quiet.stderr
    assert quiet.stdout.startswith("done: 6 steps") and len(quiet.stdout.splitlines()) == 1
    assert (tmp_path / "quiet" / "model").is_dir()


def test_embed_quiet_keeps_the_warning_and_the_result_only(tmp_path, bilm_dir):
    text = tmp_path / "raw.txt"  # raw text given as tokens: embed warns, which -q keeps
    text.write_text("The river bank, muddy.\n" + "\n".join(SENTENCES) + "\n", encoding="utf-8")
    args = ["embed", text, "--model", bilm_dir, "--threads", "1"]

    loud = spacy_elmo(*args, tmp_path / "loud.hdf5", cwd=tmp_path)
    assert has_bar(loud.stderr), loud.stderr

    quiet = spacy_elmo(*args, tmp_path / "quiet.hdf5", "-q", cwd=tmp_path)
    assert not has_bar(quiet.stdout) and not has_bar(quiet.stderr)
    warnings = [line for line in quiet.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "'bank,'" in warnings[0]
    assert quiet.stdout.splitlines() == [f"wrote 3 sentences to {tmp_path / 'quiet.hdf5'}"]


def test_probe_quiet_prints_only_the_report(tmp_path, bilm_dir):
    assets = write_assets(tmp_path / "assets")
    args = ["probe", "--assets", assets, "--model", bilm_dir, "--brown-sentences", "10"]
    loud = CliRunner().invoke(app, [str(a) for a in [*args, tmp_path / "loud"]])
    assert loud.exit_code == 0 and "pos-wsj: 4 train / 1 test lines" in loud.stdout

    quiet = CliRunner().invoke(app, [str(a) for a in [*args, tmp_path / "quiet", "-q"]])
    assert quiet.exit_code == 0, quiet.output
    assert "train /" not in quiet.output and not has_bar(quiet.output)
    assert quiet.stderr == ""
    report = (tmp_path / "quiet" / "probe.md").read_text(encoding="utf-8")
    assert quiet.stdout.startswith(report)
    assert quiet.stdout.splitlines()[-1].startswith("wrote ")
