#!/usr/bin/env python
"""Pretraining speed: the training step of `spacy-elmo pretrain` as it was (LSTM cells recorded
op by op, the char CNN on all 50 character columns) against today's (the fused cells of
`fused.py`, the char CNN on the columns that decide its max), side by side in one process.

Both run the same model, batches and optimiser: forward and backward of both LMs, the adaptive
softmax, gradient clipping and an Adam step, on real batches of the given tokenised text (one
sentence a line). Rounds alternate between the two (A B A B ...) and each reports its fastest
round, so that a busy machine slows both alike; CPU time per token is printed next to wall
time. Before timing, one batch is run through both and their gradients compared.

    python benchmarks/bench_pretrain.py CORPUS.txt [--preset bundled] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from common import git_commit

from spacy_elmo.bilm import BiLM, BiLMOptions, batch_to_ids, char_cnn, lstm
from spacy_elmo.bilm.lm_head import LMHead
from spacy_elmo.pretrain.corpus import iter_batches, read_sentences
from spacy_elmo.pretrain.presets import preset
from spacy_elmo.pretrain.trainer import LanguageModel, target_tensor
from spacy_elmo.pretrain.vocab import Vocab

IMPLEMENTATIONS = {"before: op-by-op LSTM, 50 char columns": False, "fused LSTM, trimmed CNN": True}


def use(new: bool) -> None:
    lstm.FUSED_AUTOGRAD = new
    char_cnn.TRIM_COLUMNS = new


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="tokenised text, one sentence a line")
    parser.add_argument("--preset", default="bundled")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--batches", type=int, default=6, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/pretrain_cpu"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    vocab = Vocab.build(read_sentences(args.corpus), 50000, 3)
    options = BiLMOptions.from_dict(preset(args.preset))
    stream = iter_batches(args.corpus, 0, args.batch_tokens)
    batches = [next(stream)[1] for _ in range(args.batches + 1)]
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
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
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
    args.output.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
