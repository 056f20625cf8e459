"""torch threads on a machine that other jobs share: the biLM with 1 thread and with all cores.

torch runs its CPU kernels on an OpenMP team with one thread per core, and every parallel
region ends at a barrier where the team waits for its slowest thread. On an idle machine
that costs little. When another process keeps one of the cores busy and the scheduler shares
that core fairly, the team's thread there runs only part of the time, and every barrier waits
for its next time slice; the biLM runs hundreds of small parallel regions per sentence (a few
per LSTM timestep), so it waits hundreds of times. One thread has no barrier to wait at.

The other jobs here are busy loops started in their own session (`start_new_session`), as a
job from another terminal, a service or a queue started with `setsid` is: with the kernel's
scheduler autogroups (Linux's default on desktops and many servers), each session is one group
and `nice` only ranks processes inside a group, so a niced job in its own session still takes
its fair share of a core.

For each number of busy jobs (none, one, one per core) and each setting (1 thread; one thread
per core; the same with OMP_WAIT_POLICY=PASSIVE, where waiting threads sleep instead of
spinning), a fresh process loads the bundled biLM and measures, on CoNLL-2003 test sentences:

* single-sentence latency: the median of `bilm(one sentence)` over --latency-sentences;
* batch speed: sentences/s over --batch-sentences in batches of 32.

Each of the two stops early after --budget seconds (at least 5 sentences, one batch), which
only the slowest settings reach; the counts measured are in the JSON.

Settings alternate their order across --rounds rounds; the best round is reported. Usage:

    python -m benchmarks.bench_threads            # about 6 minutes on 2 cores; idle machine
    python -m benchmarks.bench_threads --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine_info, write_results

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "results" / "threads_cpu"
BUSY_LOOP = "while True: pass"


def settings(cores: int) -> dict[str, dict[str, str]]:
    """Name -> environment of each thread setting."""
    many = str(cores)
    return {
        "1 thread": {"threads": "1"},
        f"{many} threads": {"threads": many},
        f"{many} threads, OMP_WAIT_POLICY=PASSIVE": {"threads": many, "OMP_WAIT_POLICY": "PASSIVE"},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-sentences", type=int, default=100)
    parser.add_argument("--batch-sentences", type=int, default=640)
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per measurement")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="results path, no suffix")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 and 64 sentences")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.latency_sentences, args.batch_sentences, args.rounds = 10, 64, 1
    if args.child:
        result = measure(args.latency_sentences, args.batch_sentences, args.budget)
        print(json.dumps(result), flush=True)
        return
    if args.cores < 2:
        parser.error("one core: there is no team of threads to compare with one thread")
    busy = busy_cores()
    if busy > 0.2:
        print(
            f"warning: {busy:.2f} cores busy at the start (rows without jobs want an idle machine)"
        )
    report = {
        "machine": machine_info(),
        "busy_cores_at_start": round(busy, 2),
        "options": {k: v for k, v in vars(args).items() if k not in ("child", "output")},
        "rows": run_all(args),
    }
    text = markdown(report)
    write_results(args.output, report, text)
    print(text)


def busy_cores(seconds: float = 2.0) -> float:
    """How many cores' worth of CPU time the machine spent busy over `seconds` (/proc/stat)."""

    def totals() -> tuple[int, int]:
        with open("/proc/stat") as handle:
            fields = [int(value) for value in handle.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy_before, total_before = totals()
        time.sleep(seconds)
        busy_after, total_after = totals()
    except OSError:
        return 0.0
    share = (busy_after - busy_before) / max(total_after - total_before, 1)
    return share * (os.cpu_count() or 1)


def run_all(args) -> list[dict]:
    rows = []
    named = settings(args.cores)
    for busy in sorted({0, 1, args.cores}):
        jobs = [
            subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
            for _ in range(busy)
        ]
        try:
            time.sleep(1.0 if jobs else 0.0)
            rounds: dict[str, list[dict]] = {name: [] for name in named}
            for index in range(args.rounds):
                order = list(named) if index % 2 == 0 else list(reversed(named))
                for name in order:
                    result = run_child(named[name], args)
                    rounds[name].append(result)
                    print(
                        f"busy jobs {busy}, {name}: sentence {result['sentence_ms']:.1f} ms, "
                        f"batch {result['sentences_per_s']:.0f} sentences/s",
                        flush=True,
                    )
        finally:
            for job in jobs:
                job.kill()
                job.wait()
        for name in named:
            rows.append(
                {
                    "busy_jobs": busy,
                    "setting": name,
                    "sentence_ms": min(r["sentence_ms"] for r in rounds[name]),
                    "sentences_per_s": max(r["sentences_per_s"] for r in rounds[name]),
                    "rounds": rounds[name],
                }
            )
    return rows


def run_child(setting: dict[str, str], args) -> dict:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = setting["threads"]
    if "OMP_WAIT_POLICY" in setting:
        env["OMP_WAIT_POLICY"] = setting["OMP_WAIT_POLICY"]
    command = [
        sys.executable, "-m", "benchmarks.bench_threads", "--child",
        "--latency-sentences", str(args.latency_sentences),
        "--batch-sentences", str(args.batch_sentences), "--budget", str(args.budget),
    ]  # fmt: skip
    done = subprocess.run(
        command, env=env, cwd=HERE.parent, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {setting} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(latency_sentences: int, batch_sentences: int, budget: float) -> dict:
    """In the child: load the bundled biLM and time it, on the threads of the environment."""
    import torch

    from benchmarks.common import conll_words
    from spacy_elmo.bilm.model import BiLM

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    bilm = BiLM.load().eval()
    sentences = conll_words("test", max(latency_sentences, batch_sentences))
    with torch.no_grad():
        for sentence in sentences[:10]:  # warm-up: kernels, allocator, token cache off below
            bilm(bilm.batch_to_ids([sentence]))
        bilm.token_cache_size = 0  # every call computes its char CNN, as for unseen text
        times = []
        for sentence in sentences[:latency_sentences]:
            start = time.perf_counter()
            bilm(bilm.batch_to_ids([sentence]))
            times.append(time.perf_counter() - start)
            if len(times) >= 5 and sum(times) > budget:
                break
        done = 0
        start = time.perf_counter()
        for first in range(0, batch_sentences, 32):
            batch = sentences[first : min(first + 32, batch_sentences)]
            bilm(bilm.batch_to_ids(batch))
            done += len(batch)
            if time.perf_counter() - start > budget:
                break
        elapsed = time.perf_counter() - start
    return {
        "threads": torch.get_num_threads(),
        "sentence_ms": statistics.median(times) * 1000,
        "latency_sentences": len(times),
        "sentences_per_s": done / elapsed,
        "batch_sentences": done,
    }


def markdown(report: dict) -> str:
    rows = report["rows"]
    baseline = {row["busy_jobs"]: row for row in rows if row["setting"] == "1 thread"}
    lines = [
        "# torch threads beside other jobs: the bundled biLM",
        "",
        "`python -m benchmarks.bench_threads`; "
        f"{report['machine']['cpu']}, {report['machine']['cpu_cores']} cores, "
        f"torch {report['machine']['torch']}, {report['machine']['date']}; "
        f"{report['busy_cores_at_start']} cores busy before the start. "
        "Busy jobs: `python -c 'while True: pass'`, each in its own session. "
        f"Best of {report['options']['rounds']} round(s); single sentence: median over "
        f"{report['options']['latency_sentences']} CoNLL-2003 test sentences; batch: "
        f"{report['options']['batch_sentences']} sentences in batches of 32.",
        "",
        "| busy jobs | setting | sentence ms | batch sentences/s | batch vs 1 thread |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        one = baseline[row["busy_jobs"]]["sentences_per_s"]
        lines.append(
            f"| {row['busy_jobs']} | {row['setting']} | {row['sentence_ms']:.1f} | "
            f"{row['sentences_per_s']:,.0f} | {row['sentences_per_s'] / one:.2f}x |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
