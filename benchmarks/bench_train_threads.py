"""`spacy train` of quick start 2 with the biLM on one torch thread (the `elmo` component's
default in training) against two, on an idle machine and beside two busy loops, side by side in
alternating rounds.

    python -m benchmarks.bench_train_threads [--steps 100] [--rounds 2]
        [--output benchmarks/results/train_threads_cpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_threads import BUSY_LOOP, busy_cores
from benchmarks.common import git_commit, write_results

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "benchmarks" / "results" / "train_threads_cpu"
THREADS = (1, 2)


def train_seconds(folder: Path, threads: int, steps: int) -> float:
    """Seconds of one `spacy train` of the config in `folder` with the biLM on `threads`."""
    command = [
        sys.executable, "-m", "spacy", "train", "config.cfg", "--output", f"training_{threads}",
        "--paths.train", "examples/train.spacy", "--paths.dev", "examples/dev.spacy",
        "--training.max_steps", str(steps), "--training.eval_frequency", str(steps // 2),
        "--components.elmo.threads", str(threads),
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    subprocess.run(command, cwd=folder, env=environment, check=True, capture_output=True)
    return time.perf_counter() - start


def run_all(steps: int, rounds: int) -> list[dict]:
    """Rows of (busy loops, threads, seconds of each round)."""
    rows = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        shutil.copytree(REPO / "examples", folder / "examples")
        init = [sys.executable, "-m", "spacy_elmo.cli", "init-config", "config.cfg"]
        subprocess.run([*init, "--components", "tagger,ner"], cwd=folder, check=True)
        for busy in (0, 2):
            jobs = [
                subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
                for _ in range(busy)
            ]
            try:
                seconds: dict[int, list[float]] = {threads: [] for threads in THREADS}
                for index in range(rounds):
                    order = THREADS if index % 2 == 0 else tuple(reversed(THREADS))
                    for threads in order:
                        seconds[threads].append(train_seconds(folder, threads, steps))
                        print(f"busy loops {busy}, threads {threads}: {seconds[threads][-1]:.1f} s")
            finally:
                for job in jobs:
                    job.kill()
                    job.wait()
            rows += [{"busy_loops": busy, "threads": t, "seconds": seconds[t]} for t in THREADS]
    return rows


def markdown(report: dict) -> str:
    lines = [
        f"`spacy train` of quick start 2 for {report['steps']} steps, {report['date']}, commit "
        f"{report['commit']}, {report['cpus']} CPUs, {report['busy_cores_at_start']} cores busy "
        "before the start; seconds of each round (alternating order).",
        "",
        "| busy loops | biLM threads | seconds |",
        "|---:|---:|---|",
    ]
    for row in report["rows"]:
        rounds = ", ".join(f"{value:.1f}" for value in row["seconds"])
        lines.append(f"| {row['busy_loops']} | {row['threads']} | {rounds} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--output", type=Path, default=REPO / "benchmarks/results/train_threads_cpu"
    )
    args = parser.parse_args(argv)
    report = {
        "steps": args.steps,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "busy_cores_at_start": round(busy_cores(), 2),
        "command": "python -m benchmarks.bench_train_threads",
    }
    report["rows"] = run_all(args.steps, args.rounds)
    write_results(args.output, report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
