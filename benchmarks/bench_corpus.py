"""embed-corpus on Ray against single-process `embed`, side by side in one run.

For each biLM shape (the bundled biLM; a random-weight biLM of the published "small" shape,
13.6M parameters, whose speed does not depend on its weights):

* single-process `embed` (embed_file) of the whole corpus as one file, torch with 2 threads;
* `embed-corpus --workers 1` and `--workers 2`, 1 thread each, the corpus as 50 files (50
  shards), on a local Ray instance started by the run;
* Ray's start-up (instance + workers with their model loaded) and per-shard overhead (the
  driver's wall time per shard beyond the workers' compute), peak RSS per worker;
* re-running the finished 50-shard run (nothing to do: the manifest is read, the inputs hashed).

The corpus: the tokenised sentences of CoNLL-2003 train (assets/conll2003/train.txt, fetched
by project.yml), repeated in a seeded shuffled order up to --sentences lines.

Ray binds network ports, so the script re-runs itself inside a private network namespace
(`unshare --net`, loopback only) unless it is in one. Usage:

    python -m benchmarks.bench_corpus --sentences 50000 --out benchmarks/results/corpus_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import git_commit, machine_info

REPO = Path(__file__).resolve().parent.parent

IN_NAMESPACE = "SPACY_ELMO_BENCH_NETNS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=50_000)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--shapes", default="bundled,small")
    parser.add_argument("--source", type=Path, default=REPO / "assets" / "conll2003" / "train.txt")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/corpus_cpu.md")
    parser.add_argument("--work", type=Path, default=None, help="Scratch folder (a temp dir).")
    args = parser.parse_args()
    if os.environ.get(IN_NAMESPACE) != "1":
        sys.exit(_rerun_in_namespace())
    work = Path(tempfile.mkdtemp(prefix="bench_corpus_", dir=args.work))
    try:
        results = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.write_text(report(results, args))
    print(args.out.read_text())


def _rerun_in_namespace() -> int:
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    env = {**os.environ, IN_NAMESPACE: "1", "RAY_AUTH_MODE": "disabled"}
    command = [*prefix, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable]
    return subprocess.call(
        [*command, "-m", "benchmarks.bench_corpus", *sys.argv[1:]], env=env, cwd=REPO
    )


def corpus(source: Path, n: int, seed: int = 0) -> list[str]:
    """`n` pre-tokenised sentences: CoNLL-2003 train's, reshuffled and repeated as needed."""
    sentences, words = [], []
    for line in source.read_text(encoding="utf-8").splitlines():
        token = line.split(" ")[0] if line.strip() else ""
        if token and token != "-DOCSTART-":
            words.append(token)
        elif words:
            sentences.append(" ".join(words))
            words = []
    if words:
        sentences.append(" ".join(words))
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        block = sentences[:]
        rng.shuffle(block)
        out += block
    return out[:n]


def run(args, work: Path) -> dict:
    import torch

    from spacy_elmo.bilm import BiLM, BiLMOptions
    from spacy_elmo.corpus import Cluster, embed_corpus
    from spacy_elmo.corpus.embed_file import embed_file
    from spacy_elmo.pretrain.presets import preset

    all_lines = corpus(args.source, args.sentences)
    results: dict = {
        "machine": machine_info("torch", "ray", "h5py"),
        "commit": git_commit(),
        "files": args.files,
        "load_before": os.getloadavg(),
        "parallel_capacity": parallel_capacity(),
        "shapes": {},
    }
    for spec in args.shapes.split(","):
        shape, _, count = spec.partition(":")
        lines = all_lines[: int(count)] if count else all_lines
        whole, folder = _write_corpus(work / shape, lines, args.files)
        if shape == "bundled":
            model = "bundled"
        else:
            torch.manual_seed(0)
            model = str(work / f"model_{shape}")
            BiLM(BiLMOptions.from_dict(preset(shape))).save(model)
        row: dict = {
            "model": shape,
            "sentences": len(lines),
            "tokens": sum(len(s.split()) for s in lines),
            "load_before": os.getloadavg(),
        }
        bilm = BiLM.load(model)
        for threads in (2, 1):
            torch.set_num_threads(threads)
            start, cpu = time.perf_counter(), _cpu_seconds()
            embed_file(bilm, whole, work / "single.hdf5", progress=False)
            suffix = "" if threads == 2 else "_1thread"
            row[f"single{suffix}_seconds"] = time.perf_counter() - start
            row[f"single{suffix}_cpu_seconds"] = _cpu_seconds() - cpu
            row["output_bytes"] = (work / "single.hdf5").stat().st_size
            (work / "single.hdf5").unlink()
        del bilm
        row["pair_1thread"] = embed_pair(whole, model, work)
        for workers in (1, 2):
            out = work / f"out_{shape}_{workers}"
            start = time.perf_counter()
            result = embed_corpus(
                folder,
                out,
                model=model,
                cluster=Cluster(workers=workers, threads_per_worker=1),
                progress=False,
            )
            wall = time.perf_counter() - start
            stats = result.stats
            row[f"workers{workers}"] = {
                "wall_seconds": wall,
                "startup_seconds": stats.startup_seconds,
                "run_seconds": stats.run_seconds,
                "shutdown_seconds": stats.shutdown_seconds,
                "shards": len(stats.task_seconds),
                "task_seconds": sum(stats.task_seconds),
                "cpu_seconds": stats.cpu_seconds,
                "overhead_per_shard": (stats.run_seconds * workers - sum(stats.task_seconds))
                / len(stats.task_seconds),
                "peak_rss_mb": sorted(w["peak_rss_mb"] for w in stats.workers.values()),
                "load_seconds": sorted(w["load_seconds"] for w in stats.workers.values()),
            }
            if workers == 2:
                start = time.perf_counter()
                again = embed_corpus(folder, out, model=model, progress=False)
                row["rerun_seconds"] = time.perf_counter() - start
                row["rerun_skipped"] = len(again.skipped)
            shutil.rmtree(out)
        row["load_after"] = os.getloadavg()
        results["shapes"][shape] = row
        print(json.dumps(row), flush=True)
    # Per-shard overhead alone: 100 one-line files with the bundled biLM, 2 workers.
    tiny = work / "tiny"
    for i in range(100):
        (tiny / f"{i:03d}.txt").parent.mkdir(parents=True, exist_ok=True)
        (tiny / f"{i:03d}.txt").write_text(all_lines[i] + "\n", encoding="utf-8")
    result = embed_corpus(
        tiny, work / "tiny_out", cluster=Cluster(workers=2, threads_per_worker=1), progress=False
    )
    stats = result.stats
    results["tiny_shards"] = {
        "shards": len(stats.task_seconds),
        "run_seconds": stats.run_seconds,
        "startup_seconds": stats.startup_seconds,
        "task_seconds": sum(stats.task_seconds),
        "overhead_per_shard": (stats.run_seconds * 2 - sum(stats.task_seconds))
        / len(stats.task_seconds),
    }
    results["load_after"] = os.getloadavg()
    return results


PAIR_CHILD = """
import sys, time
import torch
torch.set_num_threads(1)
from spacy_elmo import BiLM
from spacy_elmo.corpus.embed_file import embed_file
source, output, model, start_at = sys.argv[1:5]
bilm = BiLM.load(model)
while time.time() < float(start_at):
    time.sleep(0.01)
t = time.perf_counter()
embed_file(bilm, source, output, progress=False)
print(time.perf_counter() - t)
"""


def embed_pair(whole: Path, model: str, work: Path) -> dict:
    """Hand-sharding, no engine: two 1-thread processes running `embed` at the same moment, each
    on one half of the corpus. Their rate against one 1-thread process on the whole corpus is
    what this machine allows two workers of this workload (memory and caches shared, the
    hypervisor), the ceiling of `--workers 2` / `--workers 1`."""
    lines = whole.read_text(encoding="utf-8").splitlines(keepends=True)
    halves = [lines[: len(lines) // 2], lines[len(lines) // 2 :]]
    start_at = time.time() + 20  # both load their model first, then start together
    procs = []
    for i, half in enumerate(halves):
        source = work / f"half{i}.txt"
        source.write_text("".join(half), encoding="utf-8")
        command = [sys.executable, "-c", PAIR_CHILD, str(source), str(work / f"half{i}.hdf5")]
        procs.append(
            subprocess.Popen(
                [*command, model, str(start_at)], stdout=subprocess.PIPE, text=True, cwd=REPO
            )
        )
    seconds = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a pair process failed (exit {proc.returncode})")
        seconds.append(float(out.strip().splitlines()[-1]))
    for i in range(2):
        (work / f"half{i}.txt").unlink()
        (work / f"half{i}.hdf5").unlink()
    return {"seconds": seconds, "sentences": [len(h) for h in halves]}


SPIN = (
    "import time\nt = time.perf_counter()\nx = 0\nfor i in range(20_000_000): x += i\n"
    "print(time.perf_counter() - t)"
)


def parallel_capacity() -> dict:
    """How much two CPU-bound processes get done together against one alone (2.0 on two free
    cores): the ceiling of `--workers 2` over `--workers 1` on this machine."""

    def spin(n: int) -> list[float]:
        procs = [
            subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
            for _ in range(n)
        ]
        return [float(p.communicate()[0]) for p in procs]

    alone = min(spin(1)[0] for _ in range(2))
    together = spin(2)
    return {"alone": alone, "together": together, "ratio": 2 * alone / max(together)}


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _write_corpus(folder: Path, lines: list[str], files: int) -> tuple[Path, Path]:
    """The corpus as one file (for embed) and as `files` files (for embed-corpus)."""
    folder.mkdir(parents=True)
    whole = folder / "corpus.txt"
    whole.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    per_file = -(-len(lines) // files)
    for i in range(files):
        chunk = lines[i * per_file : (i + 1) * per_file]
        path = folder / "files" / f"{i:03d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(s + "\n" for s in chunk), encoding="utf-8")
    return whole, folder / "files"


def report(results: dict, args) -> str:
    rows = [
        "| biLM (sentences) | single-process embed, 2 threads | --workers 1 (1 thread) | "
        "--workers 2 (1 thread each) | w2 / single | w2 / w1 | Ray start-up (w1, w2) | "
        "re-run of the finished run | single-process, 1 thread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    pair_rows = [
        "| biLM | one 1-thread embed, whole corpus | two 1-thread embeds at once, a half each "
        "| pair / one (the ceiling) | --workers 2 / --workers 1 | --workers 2 / pair |",
        "|---|---|---|---|---|---|",
    ]
    cpu_rows = [
        "| biLM | single, 2 threads | single, 1 thread | --workers 1 | --workers 2 |",
        "|---|---|---|---|---|",
    ]
    memory, overheads = [], []
    for shape, row in results["shapes"].items():
        n = row["sentences"]
        single = n / row["single_seconds"]
        w1, w2 = (n / row[f"workers{k}"]["run_seconds"] for k in (1, 2))
        e1, e2 = (n / row[f"workers{k}"]["wall_seconds"] for k in (1, 2))
        rows.append(
            f"| {shape} ({n:,}) | {single:.1f} sent/s | {w1:.1f} sent/s ({e1:.1f} with start-up) | "
            f"{w2:.1f} sent/s ({e2:.1f} with start-up) | {w2 / single:.2f}x | {w2 / w1:.2f}x | "
            f"{row['workers1']['startup_seconds']:.1f} s, {row['workers2']['startup_seconds']:.1f}"
            f" s | {row['rerun_seconds']:.2f} s ({row['rerun_skipped']} skipped, no Ray start) | "
            f"{n / row['single_1thread_seconds']:.1f} sent/s |"
        )
        if "pair_1thread" in row:
            one = n / row["single_1thread_seconds"]
            pair = n / max(row["pair_1thread"]["seconds"])
            pair_rows.append(
                f"| {shape} | {one:.1f} sent/s | {pair:.1f} sent/s | {pair / one:.2f}x "
                f"| {w2 / w1:.2f}x | {w2 / pair:.2f}x |"
            )
        cpu = [
            row["single_cpu_seconds"],
            row["single_1thread_cpu_seconds"],
            row["workers1"]["cpu_seconds"],
            row["workers2"]["cpu_seconds"],
        ]
        cpu_rows.append(f"| {shape} | " + " | ".join(f"{n / c:.1f}" for c in cpu) + " |")
        for k in (1, 2):
            w = row[f"workers{k}"]
            memory.append(
                f"| {shape} | --workers {k} | "
                + ", ".join(f"{m:.0f} MB" for m in w["peak_rss_mb"])
                + f" | {', '.join(f'{s:.1f} s' for s in w['load_seconds'])} |"
            )
            overheads.append(
                f"| {shape} | --workers {k} | {w['shards']} | {w['overhead_per_shard'] * 1000:.0f}"
                " ms |"
            )
        rows_bytes = row["output_bytes"] / n
        memory.append(f"| {shape} | output | {rows_bytes / 1024:.1f} KB per sentence (float32) | |")
    tiny = results["tiny_shards"]
    m = results["machine"]
    return "\n".join(
        [
            "# embed-corpus on Ray vs single-process embed (CPU)",
            "",
            "Corpus: pre-tokenised sentences of CoNLL-2003 train (14.5 tokens on average) in a "
            "seeded shuffled order, repeated as needed, the first N per biLM; one file for "
            "`embed`, "
            f"{results['files']} files ({results['files']} shards) for `embed-corpus`. The "
            "`small` biLM has "
            "random weights of the published small shape (speed does not depend on the weights).",
            "",
            f"Machine: {m.get('cpu', '?')}, {m.get('cpu_cores')} cores; "
            f"torch {m.get('torch', '?')}, ray {m.get('ray', '?')}; commit {results['commit']}. "
            "Load average (1 min) before / after each biLM: "
            + ", ".join(
                f"{shape} {row['load_before'][0]:.1f} / {row['load_after'][0]:.1f}"
                for shape, row in results["shapes"].items()
            )
            + " (above 2, other jobs shared the 2 cores).",
            "",
            f"Command: `python -m benchmarks.bench_corpus --shapes {args.shapes} --sentences "
            f"{args.sentences} --source assets/conll2003/train.txt --out "
            f"{args.out}`",
            "",
            "Sentences per second of computing (the run without Ray's start-up; in brackets with"
            " it):",
            "",
            *rows,
            "",
            "Targets: `--workers 2` >= 1.0x single-process with 2 threads and >= 1.8x `--workers"
            " 1`; a re-run of a finished run < 10 s beyond Ray's start-up.",
            "",
            "This machine's parallel capacity: two CPU-bound Python processes together did "
            f"{results['parallel_capacity']['ratio']:.2f}x the work of one alone (2.00x on two "
            "free cores). For this workload, hand-sharding with no engine at all: two 1-thread "
            "`embed` processes started at the same moment, each on half the corpus, against one "
            "on the whole corpus (what two workers can get here: they share memory bandwidth, "
            "caches and the hypervisor's time):",
            "",
            *pair_rows,
            "",
            "Sentences per CPU-second (process CPU time, all threads; for embed-corpus the "
            "workers' CPU time on their shards), which other jobs on the machine change little:",
            "",
            *cpu_rows,
            "",
            "Per-shard overhead (driver's wall time x workers, minus the workers' compute, per "
            "shard):",
            "",
            "| biLM | run | shards | overhead per shard |",
            "|---|---|---|---|",
            *overheads,
            f"| bundled | 100 one-line files, --workers 2 | {tiny['shards']} | "
            f"{tiny['overhead_per_shard'] * 1000:.0f} ms |",
            "",
            "Peak resident memory per worker (ru_maxrss of the worker process) and model load:",
            "",
            "| biLM | run | peak RSS per worker | model load |",
            "|---|---|---|---|",
            *memory,
            "",
        ]
    )


if __name__ == "__main__":
    main()
