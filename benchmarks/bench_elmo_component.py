"""The elmo component's batch time by variant of its LSTM step, side by side in one process.

Loads one trained elmo pipeline (by default the seed-0 1,000-sentence evidence run,
`training/evidence/elmo_1000_s0/model-best`; --model names another) and runs only its `elmo`
component over the CoNLL-2003 test sentences, one Doc each, at the pipeline's batch size, in
every variant in turn, --rounds times (alternating order; the fastest round counts):

- float32 with torch's tanh kernel (`lstm.TANH_VIA_SIGMOID_MIN_ELEMENTS` out of reach);
- float32 with tanh through the sigmoid (the default);
- bfloat16 (`quantize = "bf16"`) with torch's tanh kernel, and with tanh through the sigmoid.

Microseconds a word of the component alone, and each variant's ratio to the default. The
variants give the same vectors up to float rounding (the two float32 ones within 1e-6) or the
bfloat16 error measured by `benchmarks.bf16_error`. Usage:

    python -m benchmarks.bench_elmo_component --threads 2      # about 2 minutes

Writes benchmarks/results/elmo_component_cpu.{json,md} (--output).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, machine_info, shown_path, write_results

DEFAULT_MODEL = REPO / "training/evidence/elmo_1000_s0/model-best"
VARIANTS = {
    "float32, torch tanh": ("none", False),
    "float32, tanh through the sigmoid (default)": ("none", True),
    "bf16, torch tanh": ("bf16", False),
    "bf16, tanh through the sigmoid": ("bf16", True),
}
DEFAULT_VARIANT = "float32, tanh through the sigmoid (default)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--test", type=Path, default=REPO / "assets/conll2003/test.txt")
    parser.add_argument(
        "--output", type=Path, default=REPO / "benchmarks/results/elmo_component_cpu"
    )
    args = parser.parse_args(argv)
    if not (args.model / "config.cfg").exists():
        raise SystemExit(
            f"no trained elmo pipeline at {args.model}: train it with `python -m workflow.evidence"
            " runs --pipelines elmo --sizes 1000 --seeds 0`, or name one with --model"
        )

    import torch

    torch.set_num_threads(args.threads)
    import spacy
    from spacy.tokens import Doc

    import spacy_elmo  # noqa: F401  (the elmo factory)
    from benchmarks.bench_pipeline import test_documents
    from spacy_elmo.bilm import lstm

    sentences = [s for doc in test_documents(args.test) for s in doc]
    sentences = sentences[: args.sentences or None]
    words = sum(map(len, sentences))
    nlp = spacy.load(args.model)
    elmo = nlp.get_pipe("elmo")
    via_sigmoid = lstm.TANH_VIA_SIGMOID_MIN_ELEMENTS

    def use(variant: str) -> None:
        quantize, sigmoid = VARIANTS[variant]
        elmo.cfg["quantize"] = quantize
        lstm.TANH_VIA_SIGMOID_MIN_ELEMENTS = via_sigmoid if sigmoid else 1 << 62

    def run() -> float:
        docs = [Doc(nlp.vocab, words=words) for words in sentences]
        start = time.perf_counter()
        for _ in elmo.pipe(docs, batch_size=nlp.batch_size):
            pass
        return time.perf_counter() - start

    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    order = list(VARIANTS)
    for variant in order:  # warm-up: bfloat16 kernels made, token cache filled
        use(variant)
        run()
    for round_index in range(args.rounds):
        for variant in order if round_index % 2 == 0 else order[::-1]:
            use(variant)
            seconds[variant].append(run())
            print(f"[round {round_index + 1}] {variant}: {seconds[variant][-1]:.2f} s", flush=True)
    use(DEFAULT_VARIANT)
    best = {variant: min(times) for variant, times in seconds.items()}
    report = {
        "machine": machine_info("spacy", "thinc"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": args.threads,
        "model": shown_path(args.model),
        "batch_size": nlp.batch_size,
        "sentences": len(sentences),
        "words": words,
        "rounds": args.rounds,
        "seconds": seconds,
        "us_per_word": {v: best[v] * 1e6 / words for v in VARIANTS},
        "vs_default": {v: best[DEFAULT_VARIANT] / best[v] for v in VARIANTS},
    }
    text = markdown(report, argv)
    write_results(args.output, report, text)
    print(text)


def markdown(report: dict, argv: list[str] | None) -> str:
    machine = report["machine"]
    arguments = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.bench_elmo_component" + "".join(f" {a}" for a in arguments)
    lines = [
        "# The elmo component's batch time by LSTM step variant (CPU)",
        "",
        f"- Machine: {machine['cpu']}, {machine['cpu_cores']} cores; torch {machine['torch']} "
        f"(kernels up to {report['cpu_capability']}); {report['threads']} thread(s); "
        f"spacy-elmo git {machine.get('git_commit', 'unknown')}; {machine['date']}",
        f"- Command: `{command}`",
        f"- Pipeline: `{report['model']}`; its elmo component alone over the "
        f"{report['sentences']:,} CoNLL-2003 test sentences ({report['words']:,} words), one Doc "
        f"each, batch size {report['batch_size']}; every variant in each of {report['rounds']} "
        "rounds (alternating order), the fastest round counts",
        "",
        "| variant | us a word | words/s | vs default |",
        "|---|---:|---:|---:|",
    ]
    for variant, us in report["us_per_word"].items():
        lines.append(
            f"| {variant} | {us:.1f} | {1e6 / us:,.0f} | {report['vs_default'][variant]:.2f}x |"
        )
    lines += [
        "",
        "Seconds of every round: "
        + "; ".join(
            f"{variant} " + ", ".join(f"{s:.2f}" for s in times)
            for variant, times in report["seconds"].items()
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
