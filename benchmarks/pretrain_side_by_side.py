"""The pretraining step's speed in several checkouts of the package, side by side: each round
runs every checkout once in a fresh process, alternating, and the table gives the fastest and
the median round of each (training tokens/s of bench_pretrain's fused step, the bundled
architecture, one thread, batches of 2,048 padded tokens, the fastest of 3 passes over 6).

    python -m benchmarks.pretrain_side_by_side CORPUS DIR DIR [DIR ...] [--rounds 6]

CORPUS is tokenised text, one sentence a line; each DIR is a checkout (e.g. `git worktree add
--detach DIR COMMIT`), whose own benchmarks/bench_pretrain.py builds and steps the model (this
script may be newer than the checkouts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def one_round(corpus: Path) -> float:
    """Training tokens/s of the fused step of the package on PYTHONPATH."""
    import torch

    from benchmarks.bench_pretrain import build_model, step_inputs, train_step, use

    torch.set_num_threads(1)
    settings = argparse.Namespace(corpus=corpus, preset="bundled", batch_tokens=2048, batches=6)
    vocab, options, batches = step_inputs(settings)
    use(True)
    model = build_model(options, len(vocab), seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, optimizer, batches[0], vocab)  # warm-up
    tokens = sum(len(sentence) for batch in batches[1:] for sentence in batch)
    fastest = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for batch in batches[1:]:
            train_step(model, optimizer, batch, vocab)
        fastest = min(fastest, time.perf_counter() - start)
    return tokens / fastest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-in", action="store_true", help=argparse.SUPPRESS)  # a worker
    args = parser.parse_args()
    if args.round_in:
        print(json.dumps(one_round(args.corpus)))
        return
    from benchmarks.common import alternating_rounds

    def arguments(checkout: Path) -> list[str]:
        return [str(args.corpus.resolve()), str(checkout), "--round-in"]

    speeds = alternating_rounds(__file__, args.checkouts, args.rounds, arguments)
    print("| checkout | fastest tokens/s | median tokens/s |\n|---|---:|---:|")
    for checkout, values in speeds.items():
        print(f"| {checkout} | {max(values):,.0f} | {statistics.median(values):,.0f} |")


if __name__ == "__main__":
    main()
