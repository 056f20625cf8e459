#!/usr/bin/env python
"""spacy-elmo's biLM against AllenNLP 2.10.1's `_ElmoBiLm`: speed, memory and exactness.

Run with the benchmark venv (see setup_allennlp_venv.sh), from the repository root:

    ../bench-venv/bin/python -m benchmarks.bench_bilm              # small, medium, original
    ../bench-venv/bin/python -m benchmarks.bench_bilm --bundled    # + the bundled model
    ../bench-venv/bin/python -m benchmarks.bench_bilm --quick      # smoke run (small, 24 sents)

For every architecture, random weights are written once in the bilm-tf hdf5 layout
(`BiLM.to_allennlp`) to a cache folder outside git; both implementations load that same file.
Sentences: the first N sentences of CoNLL-2003 valid.txt, gold tokens, natural lengths.
Each (implementation, architecture) runs in its own subprocess with `torch.set_num_threads`
(2 by default), so that its peak memory is its own:

* batch 32: every sentence once, in batches of 32; tokens/s counts real words only (no <S>,
  </S>, no padding). spacy-elmo: `BiLM.embed(sentences, batch_size=32)` (stateless mode; it
  batches longest first). AllenNLP: `batch_to_ids` + `_ElmoBiLm` + `remove_sentence_boundaries`
  per batch of 32 in input order, as `ElmoEmbedder` does, with `reset_states()` before every
  batch, which is bitwise a freshly built module (docs/MODEL.md §8), so both are stateless.
  One untimed warm-up batch first. Times include token -> char ids and the copy of every
  sentence's layers into its own float32 numpy array (3, n, 2P), for both. The pass runs
  --repeats times (3), spacy-elmo's token-vector cache cleared before each; the fastest counts.
* batch 1: the first M sentences one at a time, --repeats times; of the fastest pass, the
  median latency in ms per sentence and tokens/s (its total time).
* peak memory, two ways: the process's peak RSS (VmHWM, reset through /proc/self/clear_refs)
  during the batch-32 pass, minus its RSS after the imports and before the model was loaded;
  and the peak of the tensor memory held by torch's CPU allocator (weights included) during a
  second, untimed batch-32 pass under the profiler (`common.tensor_peak`). On CUDA,
  torch.cuda.max_memory_allocated. Both are compared with 1.3 W + A (`memory_budget`).
* exactness: the max abs difference over all layers and all real tokens between the two
  implementations' outputs, at batch 32 and at batch 1.

Writes a markdown table and JSON to benchmarks/results/bilm_<device>.{md,json}
(bilm_<device>_quick.* with --quick).
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

from benchmarks.common import conll_words, machine_info, tensor_peak, write_results

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUNDLED_DIR = REPO / "spacy_elmo" / "data" / "en_elmo_bundled"
ARCHS = ("small", "medium", "original")
IMPLS = ("spacy-elmo", "allennlp")
# "spacy-elmo-cpu": this project on the CPU whatever --device says (the reference on a GPU
# machine where AllenNLP cannot be installed).
ALL_IMPLS = IMPLS + ("spacy-elmo-cpu",)
TOLERANCE = 1e-5


# ---------------------------------------------------------------------------------- helpers
def proc_status(field: str) -> int:
    """A /proc/self/status value in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------- weights
def hdf5_parameter_count(weight_file: Path) -> int:
    import h5py

    total = 0

    def visit(_name, obj):
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.size

    with h5py.File(weight_file, "r") as handle:
        handle.visititems(visit)
    return total


def prepare_weights(arch: str, cache_dir: Path, seed: int) -> dict:
    """options.json + weights.hdf5 for `arch` (random weights, or the bundled model)."""
    import torch

    from spacy_elmo import BiLM, BiLMOptions
    from spacy_elmo.pretrain.presets import PUBLISHED_PARAMETERS

    folder = cache_dir / arch
    options_file, weight_file = folder / "options.json", folder / "weights.hdf5"
    stamp = folder / "source.json"
    if arch == "bundled":
        source = {
            "source": str(BUNDLED_DIR),
            "mtime": (BUNDLED_DIR / "model.safetensors").stat().st_mtime,
        }
    else:
        from spacy_elmo.pretrain.presets import preset

        source = {"source": f"random preset {arch!r}", "seed": seed, "options": preset(arch)}
    fresh = (
        options_file.exists()
        and weight_file.exists()
        and stamp.exists()
        and json.loads(stamp.read_text()) == source
    )
    if not fresh:
        folder.mkdir(parents=True, exist_ok=True)
        if arch == "bundled":
            bilm = BiLM.load(BUNDLED_DIR)
        else:
            torch.manual_seed(seed)
            bilm = BiLM(BiLMOptions.from_dict(source["options"]))
        bilm.to_allennlp(options_file, weight_file)
        stamp.write_text(json.dumps(source))
        print(f"[weights] wrote {weight_file}", flush=True)
    options = BiLMOptions.from_file(options_file)
    n_parameters = options.n_parameters()
    in_file = hdf5_parameter_count(weight_file)
    if arch in PUBLISHED_PARAMETERS and n_parameters != PUBLISHED_PARAMETERS[arch]:
        raise SystemExit(
            f"{arch}: {n_parameters:,} parameters, expected {PUBLISHED_PARAMETERS[arch]:,}"
        )
    if in_file != n_parameters:
        raise SystemExit(f"{arch}: the hdf5 holds {in_file:,} values, options say {n_parameters:,}")
    return {
        "options_file": str(options_file),
        "weight_file": str(weight_file),
        "n_parameters": n_parameters,
        "weights_mb": n_parameters * 4 / 2**20,
        "lstm_dim": options.lstm_dim,
        "projection_dim": options.projection_dim,
        "n_layers": options.n_layers,
        "n_highway": options.n_highway,
    }


# ---------------------------------------------------------------------------------- worker
def import_impl(impl: str):
    """The implementation's modules (imported before the memory baseline is taken)."""
    import h5py  # noqa: F401  (both read the weights with it: its libraries are no model's)

    if impl in ("spacy-elmo", "spacy-elmo-cpu"):
        from spacy_elmo import BiLM

        return BiLM
    from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids
    from allennlp.nn.util import remove_sentence_boundaries

    from benchmarks import allennlp_compat  # noqa: F401  (before allennlp: torchvision ops)

    return _ElmoBiLm, batch_to_ids, remove_sentence_boundaries


class Runner:
    """Loads one implementation; `run(batch)` -> list of float32 arrays (L + 1, n, 2P)."""

    def __init__(
        self, impl: str, options_file: str, weight_file: str, device: str, sort: bool = False
    ) -> None:
        import torch

        self.sort = sort
        if impl == "spacy-elmo-cpu":
            impl, device = "spacy-elmo", "cpu"
        self.impl, self.device = impl, torch.device(device)
        if self.device.type == "cuda":
            # Exact float32 on both sides: no TF32 in convolutions or matmuls.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        if impl == "spacy-elmo":
            BiLM = import_impl(impl)
            self.model = BiLM.from_allennlp(options_file, weight_file).eval().to(self.device)
        elif impl == "allennlp":
            _ElmoBiLm, self._batch_to_ids, self._remove = import_impl(impl)
            self.model = _ElmoBiLm(options_file, weight_file, requires_grad=False).eval()
            self.model.to(self.device)
        else:
            raise ValueError(impl)

    def tensor_bytes(self) -> int:
        """Bytes of the module's parameters and buffers (distinct storages)."""
        storages = {}
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def clear_caches(self) -> None:
        """Forget what earlier calls left behind (spacy-elmo's token vectors)."""
        if self.impl == "spacy-elmo":
            self.model.token_cache.clear()

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, batch: list[list[str]], batch_size: int) -> list:
        import numpy
        import torch

        if self.impl == "spacy-elmo":
            return self.model.embed(batch, batch_size=batch_size)
        order = list(range(len(batch)))
        if self.sort:  # --allennlp-sorted: the same longest-first batches as spacy-elmo
            order.sort(key=lambda i: -len(batch[i]))
        results: list = [None] * len(batch)
        with torch.no_grad():
            for start in range(0, len(batch), batch_size):
                indices = order[start : start + batch_size]
                sentences = [batch[i] for i in indices]
                # Stateless: equal to a freshly constructed module (docs/MODEL.md §8).
                self.model._elmo_lstm.reset_states()
                char_ids = self._batch_to_ids(sentences).to(self.device)
                output = self.model(char_ids)
                mask = output["mask"]
                layers = [self._remove(a, mask)[0] for a in output["activations"]]
                stacked = torch.stack(layers).float().cpu().numpy()  # (L + 1, b, t, 2P)
                for row, (index, sentence) in enumerate(zip(indices, sentences)):
                    results[index] = numpy.ascontiguousarray(stacked[:, row, : len(sentence)])
                del output, mask, layers, stacked  # as `embed` does: not alive in the next batch
        return results


def worker(args: argparse.Namespace) -> None:
    """One implementation on one architecture, in its own process: load it, time batch 32
    and batch 1, measure its memory; print the result as a `RESULT {json}` line and save the
    outputs for the comparison."""
    import numpy  # noqa: F401  (numpy and torch are loaded before the memory baseline)
    import torch

    spec = json.loads(args.worker_spec)
    torch.set_num_threads(spec["threads"])
    sentences = conll_words("valid", spec["sentences"])
    b1_sentences = sentences[: spec["batch1_sentences"]]
    on_cuda = spec["device"].startswith("cuda") and spec["impl"] != "spacy-elmo-cpu"
    result: dict = {"impl": spec["impl"], "arch": spec["arch"], "threads": spec["threads"]}
    runner, rss_before = load_runner(spec, result)

    # Warm-up (untimed): one batch of 32, then one sentence.
    runner.run(sentences[:32], 32)
    runner.run(sentences[:1], 1)
    runner.sync()

    outputs = time_batch32(runner, sentences, spec["repeats"], on_cuda, rss_before, result)
    b1_outputs = time_batch1(runner, b1_sentences, spec["repeats"], result)
    if not on_cuda:
        measure_tensor_peak(runner, sentences, result)
    save_outputs(Path(spec["outputs"]), outputs, b1_outputs)
    print("RESULT " + json.dumps(result), flush=True)


def load_runner(spec: dict, result: dict) -> tuple[Runner, int]:
    """The implementation's Runner, and the process's RSS after its imports, before the model
    (the memory baseline); records the imports' and the model's RSS and the load time."""
    rss_start = proc_status("VmRSS")
    import_impl(spec["impl"])
    rss_before = proc_status("VmRSS")  # the baseline: after imports, before the model
    result["imports_rss_mb"] = (rss_before - rss_start) / 2**20
    start = time.perf_counter()
    runner = Runner(
        spec["impl"],
        spec["options_file"],
        spec["weight_file"],
        spec["device"],
        sort=spec.get("sort", False),
    )
    runner.sync()
    result["load_s"] = time.perf_counter() - start
    result["rss_loaded_mb"] = (proc_status("VmRSS") - rss_before) / 2**20
    return runner, rss_before


def time_batch32(
    runner: Runner,
    sentences: list[list[str]],
    repeats: int,
    on_cuda: bool,
    rss_before: int,
    result: dict,
) -> list:
    """Every sentence in batches of 32, `repeats` times from the same state (token-vector
    cache cleared); the fastest pass counts. Peak RSS is that of the first pass (later ones
    also hold its kept outputs). Returns the first pass's outputs."""
    import torch

    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    result["peak_rss_valid"] = reset_peak_rss()
    times = []
    for repeat in range(repeats):
        runner.clear_caches()
        start = time.perf_counter()
        repeat_outputs = runner.run(sentences, 32)
        runner.sync()
        times.append(time.perf_counter() - start)
        if repeat == 0:
            outputs = repeat_outputs
            result["peak_rss_mb"] = (proc_status("VmHWM") - rss_before) / 2**20
        del repeat_outputs
    n_tokens = sum(len(s) for s in sentences)
    result.update(
        b32_sentences=len(sentences),
        b32_tokens=n_tokens,
        b32_seconds=min(times),
        b32_seconds_all=times,
        b32_tokens_per_s=n_tokens / min(times),
    )
    if on_cuda:
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["cuda_peak_over_weights_mb"] = (
            torch.cuda.max_memory_allocated() - cuda_base
        ) / 2**20
    return outputs


def time_batch1(runner: Runner, b1_sentences: list[list[str]], repeats: int, result: dict) -> list:
    """The sentences one at a time, `repeats` times; the fastest pass counts. Returns the
    first pass's outputs."""
    b1_tokens = sum(len(s) for s in b1_sentences)
    passes = []
    for repeat in range(repeats):
        latencies, repeat_outputs = [], []
        for sentence in b1_sentences:
            start = time.perf_counter()
            repeat_outputs.extend(runner.run([sentence], 1))
            runner.sync()
            latencies.append(time.perf_counter() - start)
        if repeat == 0:
            b1_outputs = repeat_outputs
        passes.append(latencies)
    latencies = min(passes, key=sum)
    result.update(
        b1_sentences=len(b1_sentences),
        b1_tokens=b1_tokens,
        b1_latency_ms_median=1000 * statistics.median(latencies),
        b1_latency_ms_mean=1000 * statistics.fmean(latencies),
        b1_tokens_per_s=b1_tokens / sum(latencies),
        b1_seconds_all=[sum(pass_) for pass_ in passes],
    )
    return b1_outputs


def measure_tensor_peak(runner: Runner, sentences: list[list[str]], result: dict) -> None:
    """The batch-32 pass again (untimed, the profiler slows it down), from the same state as
    the timed pass (token-vector cache cleared), counting what torch's CPU allocator holds:
    the weights plus everything the pass allocates."""
    runner.clear_caches()
    peak, _, _ = tensor_peak(lambda: runner.run(sentences, 32))
    result["weights_tensor_mb"] = runner.tensor_bytes() / 2**20
    result["tensor_peak_mb"] = result["weights_tensor_mb"] + peak / 2**20


def save_outputs(path: Path, outputs: list, b1_outputs: list) -> None:
    """Every sentence's layers of both passes, for `max_abs_diff`."""
    import numpy

    numpy.savez(
        path,
        b32=numpy.concatenate(outputs, axis=1),
        b32_lengths=numpy.array([o.shape[1] for o in outputs]),
        b1=numpy.concatenate(b1_outputs, axis=1),
    )


def run_worker(spec: dict, env_threads: int) -> dict:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(env_threads)
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_bilm", "--worker-spec", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    lines = [line for line in process.stdout.splitlines() if line.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        sys.stderr.write(process.stdout[-4000:] + process.stderr[-4000:])
        raise SystemExit(f"worker {spec['impl']} {spec['arch']} failed ({process.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def max_abs_diff(a_file: Path, b_file: Path, key: str, n_tokens: int | None = None) -> float:
    import numpy

    a, b = numpy.load(a_file)[key], numpy.load(b_file)[key]
    if n_tokens is not None:
        a, b = a[:, :n_tokens], b[:, :n_tokens]
    if a.shape != b.shape:
        raise SystemExit(f"{key}: shapes differ {a.shape} vs {b.shape}")
    return float(numpy.abs(a.astype("float64") - b.astype("float64")).max())


def memory_budget(sentences: list[list[str]], weights: dict, batch_size: int = 32) -> dict:
    """The memory target's terms in MB: weights W, one batch of activations A, outputs kept.

    A is the largest batch (the 32 longest sentences, padded to the longest) as float32: its
    output (L + 1, B, T, 2P) plus the input-gate pre-activations of one LSTM layer of one
    direction, (B tokens + 2 boundaries each) x 4D, what computing them in one GEMM holds.
    The benchmark keeps every sentence's (L + 1, n, 2P) float32 output, for both
    implementations: that is counted separately, not as activations.
    """
    lengths = sorted((len(s) for s in sentences), reverse=True)
    biggest = lengths[:batch_size]
    layers, width = weights["n_layers"] + 1, 2 * weights["projection_dim"]
    outputs = layers * len(biggest) * biggest[0] * width * 4
    gates = sum(n + 2 for n in biggest) * 4 * weights["lstm_dim"] * 4
    kept = sum(lengths) * layers * width * 4
    budget = {
        "weights_mb": weights["weights_mb"],
        "activations_mb": (outputs + gates) / 2**20,
        "outputs_kept_mb": kept / 2**20,
    }
    budget["budget_mb"] = (
        1.3 * budget["weights_mb"] + budget["activations_mb"] + budget["outputs_kept_mb"]
    )
    return budget


# ---------------------------------------------------------------------------------- report
def fmt(value, spec=",.0f", missing="–"):
    return missing if value is None else format(value, spec)


def markdown(report: dict) -> str:
    """The report as markdown: the machine, then the speed, difference and memory tables."""
    impls = report["settings"]["impls"]
    baseline = impls[1] if len(impls) > 1 else None
    lines = _header(report)
    lines += _speed_table(report["results"], impls, baseline)
    lines += _difference_table(report["results"], impls[0], baseline)
    lines += _memory_table(report["results"], impls)
    notes = report.get("notes") or []
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "Peak memory: peak RSS of the benchmark process during the batch-32 pass minus its RSS "
        "after the imports, before loading the model (so: weights + activations + allocator "
        "overhead); on CUDA, "
        "`torch.cuda.max_memory_allocated`. AllenNLP runs in "
        f"{report['settings'].get('allennlp_order', 'input order')} with `reset_states()` "
        "before each batch (= a fresh module per batch); spacy-elmo's `embed` sorts by length. "
        "On CUDA, TF32 is off for both (exact float32).",
        "",
    ]
    return "\n".join(lines)


def _header(report: dict) -> list[str]:
    m = report["machine"]
    device = report["settings"]["device"]
    return [
        f"# biLM benchmark: spacy-elmo vs AllenNLP `_ElmoBiLm` ({device})",
        "",
        f"- Machine: {m['cpu']}, {m['cpu_cores']} cores"
        + (f", {m.get('memory_gib')} GiB" if m.get("memory_gib") else "")
        + (f"; GPU {m['gpu']} (CUDA {m['cuda']})" if m.get("gpu") else ""),
        f"- Versions: Python {m['python']}, torch {m['torch']}, AllenNLP {m.get('allennlp')}, "
        f"spacy-elmo {m.get('spacy_elmo')} (git {m.get('git_commit', '?')})",
        f"- Date: {m['date']}",
        f"- Threads: {report['settings']['threads']} (`torch.set_num_threads`); "
        f"timed passes: the fastest of {report['settings'].get('repeats', 1)}; "
        "sentences: the first "
        f"N of CoNLL-2003 valid.txt, gold tokens, natural lengths; tokens = real words only",
        f"- Command: `{report['settings']['command']}`",
        "",
    ]


def _speed_table(results: dict, impls: list[str], baseline: str | None) -> list[str]:
    """Tokens/s and latency per architecture and implementation, the first against the second."""
    lines = [
        "| model | params | implementation | batch 32: sentences / tokens | batch 32 tokens/s "
        "| speed-up | batch 1: median ms/sentence (n) | batch 1 tokens/s | speed-up "
        "| peak memory MB (weights MB) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arch, entry in results.items():
        base = entry.get(baseline) if baseline else None
        for impl in impls:
            r = entry.get(impl)
            if r is None:
                continue
            speed32 = speed1 = "–"
            if impl == impls[0] and base:
                speed32 = f"{r['b32_tokens_per_s'] / base['b32_tokens_per_s']:.2f}x"
                speed1 = f"{r['b1_tokens_per_s'] / base['b1_tokens_per_s']:.2f}x"
            memory = r.get("cuda_peak_mb", r["peak_rss_mb"])
            label = impl + (" (GPU)" if "cuda_peak_mb" in r else "")
            lines.append(
                f"| {arch} | {entry['weights']['n_parameters'] / 1e6:.1f}M | {label} "
                f"| {r['b32_sentences']} / {r['b32_tokens']:,} | {r['b32_tokens_per_s']:,.0f} "
                f"| {speed32} | {r['b1_latency_ms_median']:.1f} ({r['b1_sentences']}) "
                f"| {r['b1_tokens_per_s']:,.0f} | {speed1} "
                f"| {memory:,.0f} ({entry['weights']['weights_mb']:,.0f}) |"
            )
    return lines


def _difference_table(results: dict, first: str, baseline: str | None) -> list[str]:
    lines = [
        "",
        f"Max abs difference of all layers (all real tokens), {first} vs {baseline} "
        f"(required <= {TOLERANCE:g} on small):",
        "",
        "| model | batch 32 | batch 1 | sentences compared (batch 32 / batch 1) |",
        "|---|---:|---:|---:|",
    ]
    for arch, entry in results.items():
        d = entry.get("max_abs_diff")
        if d:
            lines.append(
                f"| {arch} | {d['b32']:.2e} | {d['b1']:.2e} "
                f"| {d['b32_sentences']} / {d['b1_sentences']} |"
            )
    return lines


def _memory_table(results: dict, impls: list[str]) -> list[str]:
    """Peak memory (tensors and RSS) of every CPU run against `memory_budget`."""
    lines = [
        "",
        "Peak memory against the target, peak <= 1.3 W + A, with W the weights and A one batch "
        "of activations (see `memory_budget`). Tensor memory: what torch's CPU allocator holds "
        "at its peak during the batch-32 pass, weights included (the CPU analogue of "
        "`torch.cuda.max_memory_allocated`); RSS: the process's peak resident memory over its "
        "level after the imports, which also holds the outputs the benchmark keeps, the torch "
        "runtime's own buffers and what the C allocator keeps of freed memory:",
        "",
        "| model | implementation | W MB | A MB | tensor peak MB | tensor peak / (1.3 W + A) "
        "| RSS peak MB | outputs kept MB | RSS peak / (1.3 W + A + kept) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arch, entry in results.items():
        budget = entry.get("memory_budget")
        if not budget:
            continue
        for impl in impls:
            r = entry.get(impl)
            if r is None or "cuda_peak_mb" in r:
                continue
            tensor_budget = budget["budget_mb"] - budget["outputs_kept_mb"]
            tensor = r.get("tensor_peak_mb")
            lines.append(
                f"| {arch} | {impl} | {budget['weights_mb']:,.0f} "
                f"| {budget['activations_mb']:,.0f} | {fmt(tensor)} "
                f"| {fmt(tensor and tensor / tensor_budget, '.2f')} "
                f"| {r['peak_rss_mb']:,.0f} | {budget['outputs_kept_mb']:,.0f} "
                f"| {r['peak_rss_mb'] / budget['budget_mb']:.2f} |"
            )
    return lines


# ---------------------------------------------------------------------------------- main
def parse_caps(values: list[str]) -> dict[str, int]:
    caps = {}
    for value in values:
        arch, _, n = value.partition("=")
        caps[arch] = int(n)
    return caps


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default=",".join(ARCHS), help="comma-separated presets")
    parser.add_argument("--bundled", action="store_true", help="also the bundled model")
    parser.add_argument("--sentences", type=int, default=512, help="batch-32 sentences")
    parser.add_argument("--batch1-sentences", type=int, default=64)
    parser.add_argument(
        "--allennlp-sentences",
        action="append",
        default=[],
        metavar="ARCH=N",
        help="fewer sentences for AllenNLP on ARCH (batch 32), e.g. original=256",
    )
    parser.add_argument(
        "--impls",
        default=",".join(IMPLS),
        help=f"one or two of {', '.join(ALL_IMPLS)}; the first is compared with the second",
    )
    parser.add_argument(
        "--allennlp-sorted",
        action="store_true",
        help="give AllenNLP spacy-elmo's longest-first batches (default: input order)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed passes per batch size; the fastest counts (both implementations alike)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent.parent / "bench-cache",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None, help="results path without suffix")
    parser.add_argument("--quick", action="store_true", help="smoke run: small, 24 sentences")
    parser.add_argument("--worker-spec", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker_spec:
        return worker(args)

    if args.quick:
        args.archs, args.sentences, args.batch1_sentences, args.repeats = "small", 24, 4, 1
    archs = chosen_archs(args)
    impls = [i for i in args.impls.split(",") if i]
    unknown = [i for i in impls if i not in ALL_IMPLS]
    if unknown or not impls or len(impls) > 2:
        parser.error(f"--impls: one or two of {', '.join(ALL_IMPLS)} (got {args.impls!r})")
    caps = parse_caps(args.allennlp_sentences)
    device_tag = "cpu" if args.device == "cpu" else "gpu"
    output = args.output or HERE / "results" / (
        f"bilm_{device_tag}" + ("_quick" if args.quick else "")
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    args.cache_dir.mkdir(parents=True, exist_ok=True)

    report = new_report(args, argv, impls, caps)
    for arch in archs:
        report["results"][arch] = run_arch(arch, args, impls, caps, device_tag, report["notes"])
        # Write after every architecture, so that a long run leaves partial results.
        write_results(output, report, markdown(report))

    text = markdown(report)
    print()
    print(text)
    print(f"wrote {output.with_suffix('.md')} and {output.with_suffix('.json')}")
    small = report["results"].get("small", {}).get("max_abs_diff")
    if small and max(small["b32"], small["b1"]) > TOLERANCE:
        raise SystemExit(
            f"small: max abs difference {max(small['b32'], small['b1']):.2e} > {TOLERANCE:g}"
        )


def chosen_archs(args: argparse.Namespace) -> list[str]:
    """--archs, and the bundled model with --bundled when it is installed."""
    archs = [a for a in args.archs.split(",") if a]
    if args.bundled:
        if (BUNDLED_DIR / "model.safetensors").exists():
            archs.append("bundled")
        else:
            print(f"--bundled: no bundled model at {BUNDLED_DIR}; skipped", file=sys.stderr)
    return archs


def new_report(
    args: argparse.Namespace, argv: list[str] | None, impls: list[str], caps: dict[str, int]
) -> dict:
    """The report before any result: the machine and the settings."""
    command = "python -m benchmarks.bench_bilm " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    return {
        "machine": machine_info("spacy-elmo", "allennlp"),
        "settings": {
            "device": args.device,
            "threads": args.threads,
            "repeats": args.repeats,
            "sentences": args.sentences,
            "batch1_sentences": args.batch1_sentences,
            "allennlp_sentences": caps,
            "command": command.strip(),
            "seed": args.seed,
            "impls": impls,
            "allennlp_order": "longest-first order" if args.allennlp_sorted else "input order",
        },
        "results": {},
        "notes": [],
    }


def run_arch(
    arch: str,
    args: argparse.Namespace,
    impls: list[str],
    caps: dict[str, int],
    device_tag: str,
    notes: list[str],
) -> dict:
    """One architecture: its weights and memory budget, every implementation's result and,
    with two, the difference of their outputs."""
    weights = prepare_weights(arch, args.cache_dir, args.seed)
    entry: dict = {"weights": weights}
    entry["memory_budget"] = memory_budget(conll_words("valid", args.sentences), weights)
    files = {}
    for impl in impls:
        n = args.sentences
        if impl != impls[0] and arch in caps:
            n = min(n, caps[arch])
            notes.append(
                f"{arch}: {impl} at batch 32 on the first {n} sentences only (time); "
                f"{impls[0]} on {args.sentences}; the difference is over the first {n}."
            )
        files[impl] = args.cache_dir / f"outputs_{arch}_{impl}_{device_tag}.npz"
        entry[impl] = run_impl(arch, impl, n, args, weights, files[impl])
    if len(files) == 2:
        entry["max_abs_diff"] = output_differences(entry, files, impls)
        print(f"[{arch}] max abs diff: {entry['max_abs_diff']}", flush=True)
    return entry


def run_impl(
    arch: str, impl: str, n: int, args: argparse.Namespace, weights: dict, outputs: Path
) -> dict:
    """One implementation on the first `n` sentences, in its own worker process."""
    spec = {
        "impl": impl,
        "arch": arch,
        "sentences": n,
        "batch1_sentences": min(args.batch1_sentences, n),
        "threads": args.threads,
        "repeats": args.repeats,
        "device": "cpu" if impl == "spacy-elmo-cpu" else args.device,
        "outputs": str(outputs),
        "options_file": weights["options_file"],
        "weight_file": weights["weight_file"],
        "sort": impl == "allennlp" and args.allennlp_sorted,
    }
    print(f"[{arch}] {impl}: {n} sentences ...", flush=True)
    result = run_worker(spec, args.threads)
    print(
        f"[{arch}] {impl}: {result['b32_tokens_per_s']:,.0f} tokens/s at batch 32, "
        f"{result['b1_latency_ms_median']:.1f} ms median at batch 1, "
        f"peak {result.get('cuda_peak_mb', result['peak_rss_mb']):,.0f} MB",
        flush=True,
    )
    return result


def output_differences(entry: dict, files: dict[str, Path], impls: list[str]) -> dict:
    """The max abs difference of the two implementations' outputs, over the sentences both ran."""
    first, second = impls
    a, b = entry[first], entry[second]
    n32 = min(a["b32_sentences"], b["b32_sentences"])
    n1 = min(a["b1_sentences"], b["b1_sentences"])
    n32_tokens = sum(len(s) for s in conll_words("valid", n32))
    return {
        "b32": max_abs_diff(files[first], files[second], "b32", n32_tokens),
        "b1": max_abs_diff(files[first], files[second], "b1"),
        "b32_sentences": n32,
        "b1_sentences": n1,
    }


if __name__ == "__main__":
    main()
