"""The elmo pipeline with its biLM one batch ahead in a background thread (the `elmo`
component's `overlap`, the default) and in turn, side by side in one process.

`nlp.pipe` runs the components in turn on each batch: the biLM (on the torch threads), then
the tagger and NER (on one). With `overlap` (spacy_elmo/pipeline/overlap.py) the biLM runs on the
next batch, on one thread fewer, while the tagger and NER work on this one. This script runs
the elmo pipeline overlapped and in turn, in float32 (also bfloat16), with 2 torch threads,
and in turn with 1 (whose layers the overlapped run reproduces bit for bit: checked through
their entities and tags), beside the vectors
pipeline, on the CoNLL-2003 test sentences (one Doc each, as `benchmarks.bench_pipeline`
measures batch words/s), --rounds times in alternating order; the fastest round counts.

    python -m benchmarks.bench_overlap     # about 4 minutes on 2 cores

Needs the trained seed-0 1,000-sentence evidence runs of both pipelines (--runs). Writes
benchmarks/results/overlap_cpu.{json,md} (--output).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, machine_info, shown_path, write_results

# name: (pipeline, torch threads, the elmo component's overlap, its quantize)
VARIANTS = {
    "vectors (reference)": ("vectors", 2, None, None),
    "elmo, overlapped (default)": ("elmo", 2, True, "none"),
    "elmo, in turn": ("elmo", 2, False, "none"),
    "elmo, in turn, 1 thread": ("elmo", 1, False, "none"),
    "elmo bf16, overlapped": ("elmo", 2, True, "bf16"),
    "elmo bf16, in turn": ("elmo", 2, False, "bf16"),
    "elmo bf16, in turn, 1 thread": ("elmo", 1, False, "bf16"),
}
# runs whose entities must be those of another: the same biLM threads, overlapped or not
SAME_AS = {
    "elmo, overlapped (default)": "elmo, in turn, 1 thread",
    "elmo bf16, overlapped": "elmo bf16, in turn, 1 thread",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=REPO / "training/evidence")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--test", type=Path, default=REPO / "assets/conll2003/test.txt")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks/results/overlap_cpu")
    args = parser.parse_args(argv)
    models = {name: args.runs / f"{name}_1000_s0" / "model-best" for name in ("vectors", "elmo")}
    for name, path in models.items():
        if not (path / "config.cfg").exists():
            raise SystemExit(
                f"no trained {name} pipeline at {path}: train it with `python -m "
                f"workflow.evidence runs --pipelines {name} --sizes 1000 --seeds 0`"
            )

    import spacy
    import torch
    from spacy.tokens import Doc

    import spacy_elmo  # noqa: F401  (the elmo factory)
    from benchmarks.bench_pipeline import test_documents

    sentences = [s for doc in test_documents(args.test) for s in doc]
    words = sum(map(len, sentences))
    pipelines = {name: spacy.load(path) for name, path in models.items()}
    elmo = pipelines["elmo"].get_pipe("elmo")
    annotations: dict[str, list] = {}

    def run(variant: str) -> float:
        name, threads, overlap, quantize = VARIANTS[variant]
        nlp = pipelines[name]
        torch.set_num_threads(threads)
        if name == "elmo":
            elmo.cfg["overlap"], elmo.cfg["quantize"] = overlap, quantize
        docs = [Doc(nlp.vocab, words=words) for words in sentences]
        start = time.perf_counter()
        out = list(nlp.pipe(docs))
        seconds = time.perf_counter() - start
        found = [[(e.start, e.end, e.label_) for e in doc.ents] for doc in out]
        found.append([token.tag_ for doc in out for token in doc])
        annotations[variant] = found
        return seconds

    order = list(VARIANTS)
    for variant in order:  # warm-up: bfloat16 kernels made, TorchScript compiled
        run(variant)
    seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_index in range(args.rounds):
        for variant in order if round_index % 2 == 0 else order[::-1]:
            seconds[variant].append(run(variant))
            print(f"[round {round_index + 1}] {variant}: {seconds[variant][-1]:.2f} s", flush=True)
    for variant, reference in SAME_AS.items():
        if annotations[variant] != annotations[reference]:
            raise SystemExit(f"{variant}: other entities or tags than {reference}")
    words_per_second = {variant: words / min(times) for variant, times in seconds.items()}
    vectors = words_per_second[order[0]]
    report = {
        "machine": machine_info("spacy", "thinc"),
        "models": {name: shown_path(path) for name, path in models.items()},
        "sentences": len(sentences),
        "words": words,
        "rounds": args.rounds,
        "seconds": seconds,
        "words_per_second": words_per_second,
        "vs_vectors": {variant: wps / vectors for variant, wps in words_per_second.items()},
    }
    text = markdown(report, argv)
    write_results(args.output, report, text)
    print(text)


def markdown(report: dict, argv: list[str] | None) -> str:
    machine = report["machine"]
    arguments = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.bench_overlap" + "".join(f" {a}" for a in arguments)
    lines = [
        "# The elmo pipeline with its biLM one batch ahead, and in turn (CPU)",
        "",
        f"- Machine: {machine['cpu']}, {machine['cpu_cores']} cores; torch {machine['torch']}; "
        f"spacy-elmo git {machine.get('git_commit', 'unknown')}; {machine['date']}",
        f"- Command: `{command}`",
        f"- Pipelines: {', '.join(f'`{path}`' for path in report['models'].values())}; "
        f"`nlp.pipe` over the {report['sentences']:,} CoNLL-2003 test sentences "
        f"({report['words']:,} words), one Doc each, the pipeline's batch size; every variant "
        f"in each of {report['rounds']} rounds (alternating order), the fastest round counts",
        "",
        "| variant (torch threads: 2 unless said) | words/s | vs vectors |",
        "|---|---:|---:|",
    ]
    for variant, wps in report["words_per_second"].items():
        lines.append(f"| {variant} | {wps:,.0f} | {report['vs_vectors'][variant]:.2f}x |")
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
