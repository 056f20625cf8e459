#!/usr/bin/env python
"""The per-timestep products of the biLM, side by side: which kernel wins for which shape.

    python -m benchmarks.bench_kernels            # writes benchmarks/results/kernels_cpu.md

For each architecture's recurrent (4D, P) and projection (P, D) kernels, at 1, 8 and 32 rows
(the active sentences of one LSTM step), on the CPU with 2 threads: microseconds per step for

* `F.linear` (MKL; what AllenNLP and plain PyTorch run),
* oneDNN's inner product (`spacy_elmo.bilm.compiled_steps.linear`, used for kernels of
  >= 2^19 elements),
* one batched GEMM over both directions on (k, in, out) stacked kernels (used up to 2^19
  elements; the biLM stores its weights in that layout, as views), against two `F.linear`
  calls.

Kernels larger than the cache are rotated through 4 copies, so that they come from memory as
in a real step. Both directions are timed (two products per step), as the biLM runs them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
SHAPES = {  # name: (D, P)
    "bundled": (512, 128),
    "small": (1024, 128),
    "medium": (2048, 256),
    "original": (4096, 512),
}


def per_call_us(function, copies: int, repeat: int) -> float:
    for index in range(3):
        function(index % copies)
    start = time.perf_counter()
    for index in range(repeat):
        function(index % copies)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=HERE / "results" / "kernels_cpu.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    onednn = torch.ops.mkldnn._linear_pointwise
    lines = [
        f"# Per-step products, microseconds for both directions ({args.threads} threads, "
        f"torch {torch.__version__})",
        "",
        "| model | kernel | rows | F.linear x2 | oneDNN x2 | batched GEMM (in, out) | best |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, (d, p) in SHAPES.items():
            for kernel, (n_out, n_in) in (("recurrent", (4 * d, p)), ("projection", (p, d))):
                copies = 4 if n_out * n_in * 4 * 2 > 16 << 20 else 1
                weights = [torch.randn(2, n_out, n_in) * 0.05 for _ in range(copies)]
                stacked = [w.transpose(1, 2).contiguous() for w in weights]
                for rows in (1, 8, 32):
                    x = torch.randn(2, rows, n_in)
                    repeat = max(20, int(2e5 / (n_out * n_in * max(rows, 4) / 1e3)))
                    times = {
                        "F.linear x2": per_call_us(
                            lambda i, x=x, weights=weights: [
                                F.linear(x[k], weights[i][k]) for k in range(2)
                            ],
                            copies,
                            repeat,
                        ),
                        "oneDNN x2": per_call_us(
                            lambda i, x=x, weights=weights: [
                                onednn(x[k], weights[i][k], None, "none", [], "") for k in range(2)
                            ],
                            copies,
                            repeat,
                        ),
                        "batched GEMM (in, out)": per_call_us(
                            lambda i, x=x, stacked=stacked: torch.bmm(x, stacked[i]),
                            copies,
                            repeat,
                        ),
                    }
                    best = min(times, key=times.get)
                    lines.append(
                        f"| {name} | {kernel} ({n_out}, {n_in}) | {rows} | "
                        + " | ".join(f"{t:,.0f}" for t in times.values())
                        + f" | {best} |"
                    )
                    print(lines[-1], flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
