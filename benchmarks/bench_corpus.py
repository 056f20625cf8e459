"""embed-corpus on Ray against single-process `embed`, side by side in one run.

For each biLM shape (the bundled biLM; a random-weight biLM of the published "small" shape,
13.6M parameters, whose speed does not depend on its weights):

* single-process `embed` (embed_file) of the whole corpus as one file, torch with 2 threads;
* `embed-corpus --workers 1` and `--workers 2`, 1 thread each, the corpus as 50 files (50
  shards), on a local Ray instance started by the run;
* Ray's start-up (instance + workers with their model loaded), as the run reports it;
* the run's processes, measured from outside: a thread of this script samples every process
  the run starts (Ray's services, its workers, the run's watchdog) every 0.5 s with psutil, for
  their CPU seconds (the workers' over their whole life, imports and model load included) and
  each worker's peak resident memory (the highest sample: a spike between two samples, and
  what a process uses after its last one, are missed);
* per-shard overhead, approximated: the run's time x workers, minus the time one 1-thread
  `embed` process alone takes on the same sentences, per shard; with 2 workers it includes what
  they lose to sharing the machine;
* re-running the finished 50-shard run (nothing to do: the manifest is read, the inputs hashed).

The engine reports no time per shard, model load time per worker or shut-down time, so none
is shown (start-up includes the model loads).

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
import threading
import time
from pathlib import Path

from benchmarks.common import git_commit, machine_info

REPO = Path(__file__).resolve().parent.parent

IN_NAMESPACE = "SPACY_ELMO_BENCH_NETNS"

# How often the run's processes are sampled (as often as the run's watchdog looks at them).
SAMPLE_SECONDS = 0.5


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
    from spacy_elmo.corpus.engine import require_ray
    from spacy_elmo.pretrain.presets import preset

    require_ray()  # imported now, not in the first run measured
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
        # Every file one shard, whatever its length.
        shard_lines = max(1, -(-len(lines) // args.files))
        for workers in (1, 2):
            out = work / f"out_{shape}_{workers}"
            cluster = Cluster(workers=workers, threads_per_worker=1)
            measured = measured_run(
                folder, out, cluster, model=model, shard_lines=shard_lines, progress=False
            )
            measured["overhead_per_shard"] = overhead_per_shard(
                measured, workers, row["single_1thread_seconds"]
            )
            row[f"workers{workers}"] = measured
            if workers == 2:
                start = time.perf_counter()
                again = embed_corpus(
                    folder, out, model=model, shard_lines=shard_lines, progress=False
                )
                row["rerun_seconds"] = time.perf_counter() - start
                row["rerun_skipped"] = len(again.skipped)
            shutil.rmtree(out)
        row["load_after"] = os.getloadavg()
        results["shapes"][shape] = row
        print(json.dumps(row), flush=True)
    # Per-shard overhead alone: 100 one-line files with the bundled biLM, 2 workers, against
    # one 1-thread process embedding the same 100 lines as one file.
    tiny, _ = _write_corpus(work / "tiny", all_lines[:100], 100)
    torch.set_num_threads(1)
    bilm = BiLM.load("bundled")
    start = time.perf_counter()
    embed_file(bilm, tiny, work / "tiny.hdf5", progress=False)
    single_seconds = time.perf_counter() - start
    del bilm
    cluster = Cluster(workers=2, threads_per_worker=1)
    measured = measured_run(tiny.parent / "files", work / "tiny_out", cluster, progress=False)
    measured["single_1thread_seconds"] = single_seconds
    measured["overhead_per_shard"] = overhead_per_shard(measured, 2, single_seconds)
    results["tiny_shards"] = measured
    results["load_after"] = os.getloadavg()
    return results


def measured_run(input: Path, output: Path, cluster, **options) -> dict:
    """`embed_corpus` with its processes sampled from outside (RunProcesses): the run's times,
    shards (one per input file), and CPU seconds and peak memory of its processes."""
    from spacy_elmo.corpus import embed_corpus

    start, cpu = time.perf_counter(), _cpu_seconds()
    with RunProcesses() as processes:
        result = embed_corpus(input, output, cluster=cluster, **options)
    wall = time.perf_counter() - start
    stats = result.stats
    workers = {int(name.rpartition(":")[2]) for name in stats.workers}  # "host:pid"
    others = set(processes.cpu_seconds) - workers
    return {
        "wall_seconds": wall,
        "startup_seconds": stats.startup_seconds,
        "run_seconds": stats.run_seconds,
        "shards": len(list(input.glob("*.txt"))),
        "workers_cpu_seconds": sum(processes.cpu_seconds.get(pid, 0.0) for pid in workers),
        "ray_cpu_seconds": sum(processes.cpu_seconds[pid] for pid in others),
        "driver_cpu_seconds": _cpu_seconds() - cpu - processes.own_cpu_seconds,
        "peak_rss_mb": sorted(
            processes.peak_rss[pid] / 2**20 for pid in workers if pid in processes.peak_rss
        ),
    }


def overhead_per_shard(measured: dict, workers: int, single_1thread_seconds: float) -> float:
    """An approximation: the run's time x workers, minus what one 1-thread process alone takes
    on the same sentences, per shard (as if each worker computed at that process's rate)."""
    busy = measured["run_seconds"] * workers
    return (busy - single_1thread_seconds) / measured["shards"]


class RunProcesses:
    """The processes started below this one while it is entered (a corpus run's Ray services,
    workers and watchdog), sampled every SAMPLE_SECONDS on a thread: per pid, the last CPU time
    seen (user + system, all its threads) and the highest resident memory seen."""

    def __init__(self) -> None:
        self.cpu_seconds: dict[int, float] = {}
        self.peak_rss: dict[int, int] = {}
        self.own_cpu_seconds = 0.0  # the sampling thread's, part of this process's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="sampler", daemon=True)

    def __enter__(self) -> RunProcesses:
        self._thread.start()
        return self

    def __exit__(self, *error) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil

        this = psutil.Process()
        while not self._stop.is_set():
            for process in this.children(recursive=True):
                try:
                    with process.oneshot():
                        cpu = process.cpu_times()
                        rss = process.memory_info().rss
                except psutil.Error:  # ended meanwhile
                    continue
                self.cpu_seconds[process.pid] = cpu.user + cpu.system
                self.peak_rss[process.pid] = max(rss, self.peak_rss.get(process.pid, 0))
            self.own_cpu_seconds = time.thread_time()
            self._stop.wait(SAMPLE_SECONDS)


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
    processes, overheads, outputs = [], [], []
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
            row["workers1"]["workers_cpu_seconds"],
            row["workers2"]["workers_cpu_seconds"],
        ]
        cpu_rows.append(f"| {shape} | " + " | ".join(f"{n / c:.1f}" for c in cpu) + " |")
        for k in (1, 2):
            w = row[f"workers{k}"]
            processes.append(
                f"| {shape} | --workers {k} | {w['workers_cpu_seconds']:.1f} s | "
                f"{w['ray_cpu_seconds']:.1f} s | {w['driver_cpu_seconds']:.1f} s | "
                + ", ".join(f"{m:.0f} MB" for m in w["peak_rss_mb"])
                + " |"
            )
            overheads.append(
                f"| {shape} | --workers {k} | {w['shards']} | {w['overhead_per_shard'] * 1000:.0f}"
                " ms |"
            )
        outputs.append(f"{shape} {row['output_bytes'] / n / 1024:.1f} KB")
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
            "worker processes' CPU time over their life, imports and model load included, "
            "sampled from outside), which other jobs on the machine change little:",
            "",
            *cpu_rows,
            "",
            "Per-shard overhead, an approximation: the run's time (without Ray's start-up) x "
            "workers, minus the time one 1-thread `embed` process alone takes on the same "
            "sentences, per shard. With 2 workers it includes what they lose to sharing the "
            "machine (the hand-sharding table above); below 0, a worker computed faster than "
            "the process alone:",
            "",
            "| biLM | run | shards | overhead per shard |",
            "|---|---|---|---|",
            *overheads,
            f"| bundled | 100 one-line files, --workers 2 | {tiny['shards']} | "
            f"{tiny['overhead_per_shard'] * 1000:.0f} ms |",
            "",
            f"The run's processes, sampled from outside every {SAMPLE_SECONDS} s (psutil): CPU "
            "time of the workers (imports and model load included), of Ray's other processes "
            "(its services, idle workers, the run's watchdog) and of the driver (this script's "
            "process, the sampling left out); each worker's highest resident memory sampled (a "
            "spike between two samples is missed). The engine reports no model load time per "
            "worker: Ray's start-up above includes it.",
            "",
            "| biLM | run | workers' CPU | Ray's other CPU | driver CPU | peak RSS per worker |",
            "|---|---|---|---|---|---|",
            *processes,
            "",
            f"Output: {', '.join(outputs)} per sentence (float32).",
            "",
        ]
    )


if __name__ == "__main__":
    main()
