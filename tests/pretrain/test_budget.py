"""A pretraining run says its budget before its first step (steps, tokens, where), an estimate
of its time once a few steps are timed, and names its perplexity plot in its last line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spacy_elmo.pretrain import PretrainConfig, pretrain
from spacy_elmo.pretrain.records import budget_line, duration, estimate_line

from .test_pretrain import short_config, write_corpus

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ["the river bank was muddy .", "she paid the bank in cash ."]


def config(**values) -> PretrainConfig:
    return PretrainConfig(inputs=["in.txt"], output="run", **values)


def test_durations_read_as_a_budget():
    assert [duration(s) for s in (40, 89, 90, 1500, 7199, 7200, 51_120)] == [
        "40 s", "89 s", "2 min", "25 min", "120 min", "2.0 h", "14.2 h",
    ]  # fmt: skip


def test_the_budget_names_steps_tokens_and_place():
    bundled = config(max_steps=10_000, batch_tokens=2048)
    assert budget_line(bundled, 0, 2, "cpu") == (
        "training 10,000 steps of up to 2,048 tokens each (up to 20.5M tokens) on 2 CPU "
        "threads; an estimate of the time follows after 6 steps"
    )
    resumed = budget_line(config(max_steps=300, batch_tokens=256), 200, 1, "cpu")
    assert resumed.startswith("training 100 steps (steps 201 to 300) of up to 256 tokens each")
    assert "(up to 25,600 tokens) on 1 CPU thread;" in resumed
    assert " on cuda:0;" in budget_line(bundled, 0, 2, "cuda:0")


def test_the_estimate_is_the_steps_left_at_the_timed_pace():
    bundled = config(max_steps=10_000, eval_every=500)
    # 9,994 steps at 5.12 s: 51,169 s, 14.2 h; held-out evaluations at 500, 1000, ... 10,000
    assert estimate_line(bundled, 6, [9.0] + [5.12] * 5) == (
        "estimate: 14.2 h for the 9,994 steps left at 5.12 s a step (the mean of 5 steps), plus "
        "20 held-out evaluations; Ctrl-C writes a checkpoint and --resume continues"
    )
    # 14 steps left from step 6 of 20, evaluations every 8: at 8, 16 and the last step
    short = estimate_line(config(max_steps=20, eval_every=8), 6, [1.0] * 6)
    assert "plus 3 held-out evaluations" in short


def test_the_estimate_leaves_out_the_first_step():
    line = estimate_line(config(max_steps=100), 6, [9.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert "at 3.00 s a step (the mean of 5 steps)" in line  # (1 + 2 + 3 + 4 + 5) / 5


def test_a_run_done_before_its_timing_is_ready_says_no_estimate(tmp_path, caplog):
    corpus = write_corpus(tmp_path / "corpus.txt")
    with caplog.at_level("INFO", logger="spacy_elmo.pretrain"):
        pretrain(short_config(tmp_path, corpus, max_steps=6))
    assert "training 6 steps" in caplog.text and "estimate: " not in caplog.text


def test_a_run_says_its_budget_first_and_names_its_plot_last(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(SENTENCES * 100) + "\n", encoding="utf-8")
    command = [
        sys.executable, "-m", "spacy_elmo.cli", "pretrain", str(text), str(tmp_path / "run"),
        "--preset", "tiny", "--vocab-size", "100", "--min-count", "1", "--batch-tokens", "256",
        "--max-steps", "12", "--warmup-steps", "2", "--eval-every", "5", "--threads", "1",
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines() if "INFO" in line]
    budget = [i for i, line in enumerate(lines) if "training 12 steps of up to 256" in line]
    estimate = [i for i, line in enumerate(lines) if "estimate: " in line]
    assert len(budget) == 1 and len(estimate) == 1 and budget[0] < estimate[0], done.stderr
    assert "for the 6 steps left" in lines[estimate[0]]
    assert "plus 2 held-out evaluations" in lines[estimate[0]]  # at steps 10 and 12
    last = done.stdout.splitlines()[-1]
    assert last.startswith("done: 12 steps")
    plot = tmp_path / "run" / "perplexity.png"
    assert last.endswith(f"perplexity plot {plot}") == plot.exists()
