"""The figures of the README's quick starts and of usage.md's sense check, measured again and
recorded: the cosine of quick start 1's two "bank" vectors, the mean top-layer similarity of
"bank" to "bank" of the same sense and of the other across the sentence frames (`FRAMES`,
which tests/pipeline/test_vectors.py uses too), and how long quick start 2's two commands take here.

    python -m workflow.readme_figures [--output results/readme/figures]

Writes OUTPUT.json and OUTPUT.md with the date, commit, CPU count and load average (the time of
quick start 2 depends on what else the cores run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import product
from pathlib import Path

import numpy as np

from benchmarks.common import git_commit, write_results

REPO = Path(__file__).resolve().parents[1]
FRAMES = [
    "the {} bank flooded",
    "we walked to the {} bank",
    "they sat by the {} bank all day",
    "the {} bank was closed",
    "he swam to the {} bank of the lake",
    "he borrowed money from the {} bank",
]
SENSES = {"river": ["river", "muddy"], "finance": ["investment", "savings"]}
QUICK_START_2 = [
    ["spacy-elmo", "init-config", "config.cfg", "--components", "tagger,ner"],
    [
        "python", "-m", "spacy", "train", "config.cfg", "--output", "training",
        "--paths.train", "examples/train.spacy", "--paths.dev", "examples/dev.spacy",
        "--training.max_steps", "300", "--training.eval_frequency", "100",
    ],
]  # fmt: skip


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def bank_similarities() -> dict[str, float]:
    """Quick start 1's cosine, and the same-sense and other-sense means of the sense check."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"vector_hooks": True})
    river = nlp("The river bank overflowed after heavy rain")
    money = nlp("The investment bank lent money")
    banks = []  # (frame, sense, top-layer vector of "bank")
    for (frame, text), (sense, words) in product(enumerate(FRAMES), SENSES.items()):
        for word in words:
            doc = nlp(text.format(word))
            index = [t.text for t in doc].index("bank")
            banks.append((frame, sense, doc._.elmo_layers[-1, index]))
    same, other = [], []
    for (frame_a, sense_a, a), (frame_b, sense_b, b) in product(banks, banks):
        if frame_a != frame_b:
            (same if sense_a == sense_b else other).append(cosine(a, b))
    return {
        "quick_start_1_bank_cosine": cosine(river._.elmo_layers[-1, 2], money._.elmo_layers[-1, 2]),
        "sense_check_same_sense_mean": float(np.mean(same)),
        "sense_check_other_sense_mean": float(np.mean(other)),
    }


def quick_start_2_seconds() -> float:
    """Seconds of quick start 2's two commands, run as written in a folder with examples/."""
    with tempfile.TemporaryDirectory() as folder:
        shutil.copytree(REPO / "examples", Path(folder) / "examples")
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        start = time.perf_counter()
        for command in QUICK_START_2:
            if command[0] == "spacy-elmo":
                command = [sys.executable, "-m", "spacy_elmo.cli", *command[1:]]
            elif command[0] == "python":
                command = [sys.executable, *command[1:]]
            subprocess.run(command, cwd=folder, env=environment, check=True, capture_output=True)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("results/readme/figures"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    report = {
        **bank_similarities(),
        "quick_start_2_seconds": quick_start_2_seconds(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "command": "python -m workflow.readme_figures",
    }
    text = (
        f"`{report['command']}`, {report['date']}, commit {report['commit']}, "
        f"{report['cpus']} CPUs (load average {load_before:.1f} before, "
        f"{report['load_average_after']:.1f} after)\n\n"
        "| figure | value |\n|---|---:|\n"
        f'| quick start 1: cosine of the two "bank" vectors | '
        f"{report['quick_start_1_bank_cosine']:.4f} |\n"
        f"| sense check, top layer: same sense, mean | "
        f"{report['sense_check_same_sense_mean']:.4f} |\n"
        f"| sense check, top layer: other sense, mean | "
        f"{report['sense_check_other_sense_mean']:.4f} |\n"
        f"| quick start 2: init-config + spacy train, seconds | "
        f"{report['quick_start_2_seconds']:.0f} |\n"
    )
    write_results(args.output, report, text)
    print(text)


if __name__ == "__main__":
    main()
