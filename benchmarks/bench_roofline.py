#!/usr/bin/env python
"""How far the pretraining step is from this CPU's ceiling: the arithmetic of one training
step of `spacy-elmo pretrain` (the same step as `bench_pretrain.py`), counted, against the
speed of this machine's matrix multiplications, measured in the same process.

* **FLOPs per training token**: torch's own `FlopCounterMode` counts every matrix product
  and convolution that one step dispatches, forward and backward, for the fused path (today's)
  and the op-by-op path (before). Its table has no in-place products, so `baddbmm_` (the fused
  cells' recurrent product) and `addmm_` are added with the formulas of their out-of-place
  forms, and the step fails if any other product-like op (a name with mm, mv, dot, conv or
  linear) is dispatched uncounted. Elementwise work (gates, activations, the optimiser) is not
  counted: it is memory-bound and makes the ceiling below higher than it can be, never lower.
* **GEMM speed**: float32 `torch.mm` on the shapes that dominate the step (the recurrent and
  input GEMMs of a batch, the highway and softmax-head GEMMs) and one large square product,
  each the fastest of several calls; the best of them is this core's GEMM rate.
* **Ceiling**: GEMM rate / FLOPs per token, the training tokens/s that one step could reach if
  it did nothing but its matrix products at the best rate measured. A speed-up target above the
  ceiling cannot be reached on the same architecture without doing less arithmetic per token.
* **LSTM floor**: the arithmetic that any exact training step of the architecture must do in its
  LSTMs alone, from the shapes (no padding, no <S>/</S> positions, no char CNN, no softmax):
  per token, layer and direction 2 (4DP + 4DP + DP) FLOPs forward (input, recurrent and
  projection products), three times that with the backward pass (input and weight gradients).

Timed parts alternate (step, GEMMs, step, ...) so that a busy machine slows both alike.

    python -m benchmarks.bench_roofline CORPUS.txt [--preset bundled] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.utils.flop_counter as flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.bench_pretrain import (
    IMPLEMENTATIONS,
    build_model,
    step_inputs,
    step_parser,
    train_step,
    use,
)
from benchmarks.common import git_commit, machine_info, write_results
from spacy_elmo.bilm import BiLMOptions
from spacy_elmo.bilm.lm_head import DEFAULT_CUTOFFS

aten = torch.ops.aten


# In-place products, counted as their out-of-place forms (FlopCounterMode's table lacks them).
def _baddbmm_flop(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    return flop_counter.bmm_flop(a_shape, b_shape)


def _addmm_flop(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    return flop_counter.mm_flop(a_shape, b_shape)


IN_PLACE = {aten.baddbmm_: _baddbmm_flop, aten.addmm_: _addmm_flop}
PRODUCT_LIKE = ("mm", "mv", "dot", "conv", "linear")


class UncountedProducts(TorchDispatchMode):
    """Records the product-like ops that a FlopCounterMode with IN_PLACE would not count."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.counted = set(flop_counter.flop_registry) | set(IN_PLACE)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        name = packet.__name__
        if any(word in name for word in PRODUCT_LIKE) and packet not in self.counted:
            self.seen.add(str(packet))
        return func(*args, **(kwargs or {}))


def step_flops(model, optimizer, batch, vocab) -> int:
    """Matrix-product and convolution FLOPs of one training step (forward and backward)."""
    with UncountedProducts() as uncounted:
        with flop_counter.FlopCounterMode(display=False, custom_mapping=IN_PLACE) as counter:
            train_step(model, optimizer, batch, vocab)
    if uncounted.seen:
        raise RuntimeError(f"products the FLOP count misses: {', '.join(sorted(uncounted.seen))}")
    return counter.get_total_flops()


def lstm_floor_flops(options: BiLMOptions) -> float:
    """Least FLOPs per training token of the LSTMs: 3 x 2 x layers x 2 directions x (9 D P)."""
    lstm, proj = options.lstm_dim, options.projection_dim
    forward = 2 * (4 * lstm * proj + 4 * lstm * proj + lstm * proj)  # input, recurrent, projection
    return 3 * forward * options.n_layers * 2


def gemm_shapes(options: BiLMOptions, rows: int, positions: int) -> dict[str, tuple[int, int, int]]:
    """(m, k, n) of the step's main products: `rows` sentences a step, `positions` a batch."""
    lstm, proj, filters = options.lstm_dim, options.projection_dim, options.n_filters
    head = DEFAULT_CUTOFFS[0] + len(DEFAULT_CUTOFFS)  # shortlist words + one logit per cluster
    shapes = {
        "recurrent h @ W": (rows, proj, 4 * lstm),
        "projection c @ P": (rows, lstm, proj),
        "inputs of all steps": (positions, proj, 4 * lstm),
        "highway": (1024, filters, 2 * filters),
        "softmax head": (positions, proj, head),
        "square": (1024, 1024, 1024),
    }
    return {f"{name} ({m} x {k} x {n})": (m, k, n) for name, (m, k, n) in shapes.items()}


def gemm_rate(m: int, k: int, n: int, calls: int = 20) -> float:
    """GFLOP/s of the fastest of `calls` float32 (m, k) @ (k, n) products."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    torch.mm(a, b, out=out)
    best = float("inf")
    repeat = max(1, int(2e8 // (2 * m * k * n)))  # about 0.2 GFLOP per timed call
    for _ in range(calls):
        start = time.perf_counter()
        for _ in range(repeat):
            torch.mm(a, b, out=out)
        best = min(best, (time.perf_counter() - start) / repeat)
    return 2 * m * k * n / best / 1e9


def main() -> None:
    args = step_parser(__doc__.split("\n\n")[0], "benchmarks/results/roofline_cpu").parse_args()
    torch.set_num_threads(args.threads)
    vocab, options, batches = step_inputs(args)
    tokens = sum(len(s) for batch in batches[1:] for s in batch)
    rows = round(sum(len(batch) for batch in batches[1:]) / args.batches)

    runs, flops = {}, {}
    for name, fused in IMPLEMENTATIONS.items():
        use(fused)
        model = build_model(options, len(vocab), seed=0)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        train_step(model, optimizer, batches[0], vocab)  # warm-up
        flops[name] = sum(step_flops(model, optimizer, b, vocab) for b in batches[1:]) / tokens
        runs[name] = (model, optimizer, fused)

    shapes = gemm_shapes(options, rows, args.batch_tokens)
    step_s: dict[str, float] = {}
    rates: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (model, optimizer, fused) in runs.items():
            use(fused)
            start = time.perf_counter()
            for batch in batches[1:]:
                train_step(model, optimizer, batch, vocab)
            step_s[name] = min(step_s.get(name, float("inf")), time.perf_counter() - start)
        for label, shape in shapes.items():
            rates[label] = max(rates.get(label, 0.0), gemm_rate(*shape))
    use(True)

    peak = max(rates.values())
    reference = next(iter(IMPLEMENTATIONS))
    reference_tps = tokens / step_s[reference]
    floor = lstm_floor_flops(options)
    result = {
        "preset": args.preset,
        "threads": args.threads,
        "batch_tokens": args.batch_tokens,
        "tokens_per_round": tokens,
        "sentences_per_batch": rows,
        "gemm_gflops": rates,
        "peak_gemm_gflops": peak,
        "lstm_floor": {
            "mflop_per_token": floor / 1e6,
            "ceiling_tokens_per_s": peak * 1e9 / floor,
            "ceiling_over_before": peak * 1e9 / floor / reference_tps,
        },
        "commit": git_commit(),
        "machine": machine_info(),
        "results": {},
    }
    for name in runs:
        tps = tokens / step_s[name]
        ceiling = peak * 1e9 / flops[name]
        result["results"][name] = {
            "mflop_per_token": flops[name] / 1e6,
            "tokens_per_s": tps,
            "achieved_gflops": tps * flops[name] / 1e9,
            "ceiling_tokens_per_s": ceiling,
            "ceiling_over_before": ceiling / reference_tps,
            "speedup": tps / reference_tps,
        }
    text = render(result, args)
    write_results(args.output, result, text)
    print(text)


def render(result: dict, args: argparse.Namespace) -> str:
    lines = [
        f"Pretraining step against this CPU's GEMM speed: preset {args.preset}, "
        f"{args.threads} thread(s), batches of {args.batch_tokens} padded tokens "
        f"({result['sentences_per_batch']} sentences on average), fastest of {args.rounds} "
        f"rounds of {args.batches} batches; FLOPs are torch's FlopCounterMode count of the matrix "
        "products and convolutions of the step, forward and backward.",
        "",
        "| float32 GEMM (m x k x n) | GFLOP/s |",
        "|---|---:|",
    ]
    lines += [f"| {label} | {rate:,.1f} |" for label, rate in result["gemm_gflops"].items()]
    lines += [
        "",
        "| step | MFLOP per token | training tokens/s | achieved GFLOP/s | ceiling tokens/s "
        "(best GEMM rate / FLOPs) | ceiling / before | measured speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in result["results"].items():
        lines.append(
            f"| {name} | {row['mflop_per_token']:.1f} | {row['tokens_per_s']:,.0f} | "
            f"{row['achieved_gflops']:.1f} | {row['ceiling_tokens_per_s']:,.0f} | "
            f"{row['ceiling_over_before']:.2f}x | {row['speedup']:.2f}x |"
        )
    floor = result["lstm_floor"]
    lines.append(
        f"| LSTM floor: the LSTMs' least arithmetic alone (no CNN, softmax, padding or "
        f"boundaries) | {floor['mflop_per_token']:.1f} | – | – | "
        f"{floor['ceiling_tokens_per_s']:,.0f} | {floor['ceiling_over_before']:.2f}x | – |"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
