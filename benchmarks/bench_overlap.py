"""Would the elmo pipeline run faster with its biLM in a background thread? Side by side in
one process.

`nlp.pipe` runs the components in turn on each batch: the biLM (on the torch threads), then
the tagger and NER (on one). On two cores the second is idle while the tagger and NER work.
This script measures the elmo pipeline as it ships, and with the `elmo` component's `pipe`
replaced by one that runs the biLM on the next batch in a background thread while the tagger
and NER work on this one (torch's kernels release the GIL); each with 1 and 2 torch threads,
beside the vectors pipeline, on the CoNLL-2003 test sentences (one Doc each, as
`benchmarks.bench_pipeline` measures batch words/s), --rounds times in alternating order, the
fastest round counts. Both ways give the same annotations (checked on every run).

    python -m benchmarks.bench_overlap --threads 2     # about 3 minutes on 2 cores

Needs the trained seed-0 1,000-sentence evidence runs of both pipelines (--runs). Writes
benchmarks/results/overlap_cpu.{json,md} (--output).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import REPO, machine_info, shown_path


def overlapped_pipe(component, stream, *, batch_size: int = 128):
    """`component.pipe` with the prediction of batch i + 1 running in a worker thread while
    the docs of batch i are with the components downstream; annotations are written here."""
    from spacy.util import minibatch

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        pending = None
        for docs in minibatch(stream, size=batch_size):
            future = pool.submit(component.predict, docs)
            if pending is not None:
                yield from _finish(component, *pending)
            pending = (docs, future)
        if pending is not None:
            yield from _finish(component, *pending)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _finish(component, docs, future):
    component.set_annotations(docs, future.result())
    yield from docs


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
    shipped_pipe = elmo.pipe
    variants = {  # name: (pipeline, torch threads, overlapped)
        "vectors (reference), 2 threads": ("vectors", 2, False),
        "elmo, in turn (as shipped), 2 threads": ("elmo", 2, False),
        "elmo, in turn, 1 thread": ("elmo", 1, False),
        "elmo, biLM in a background thread, 1 thread": ("elmo", 1, True),
        "elmo, biLM in a background thread, 2 threads": ("elmo", 2, True),
    }
    reference = {}

    def run(variant: str) -> float:
        name, threads, overlapped = variants[variant]
        nlp = pipelines[name]
        torch.set_num_threads(threads)
        if overlapped:
            elmo.pipe = lambda stream, batch_size=128: overlapped_pipe(
                elmo, stream, batch_size=batch_size
            )
        else:
            elmo.pipe = shipped_pipe
        docs = [Doc(nlp.vocab, words=words) for words in sentences]
        start = time.perf_counter()
        out = list(nlp.pipe(docs))
        seconds = time.perf_counter() - start
        elmo.pipe = shipped_pipe
        annotations = [[(e.start, e.end, e.label_) for e in doc.ents] for doc in out]
        annotations.append([token.tag_ for doc in out for token in doc])
        if reference.setdefault(name, annotations) != annotations:
            raise SystemExit(f"{variant}: other annotations than the first run of {name}")
        return seconds

    order = list(variants)
    for variant in order:  # warm-up
        run(variant)
    seconds: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_index in range(args.rounds):
        for variant in order if round_index % 2 == 0 else order[::-1]:
            seconds[variant].append(run(variant))
            print(f"[round {round_index + 1}] {variant}: {seconds[variant][-1]:.2f} s", flush=True)
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
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report, argv)
    args.output.with_suffix(".md").write_text(text)
    print(text)


def markdown(report: dict, argv: list[str] | None) -> str:
    machine = report["machine"]
    arguments = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.bench_overlap" + "".join(f" {a}" for a in arguments)
    lines = [
        "# The elmo pipeline with its biLM in a background thread (CPU)",
        "",
        f"- Machine: {machine['cpu']}, {machine['cpu_cores']} cores; torch {machine['torch']}; "
        f"spacy-elmo git {machine.get('git_commit', 'unknown')}; {machine['date']}",
        f"- Command: `{command}`",
        f"- Pipelines: {', '.join(f'`{path}`' for path in report['models'].values())}; "
        f"`nlp.pipe` over the {report['sentences']:,} CoNLL-2003 test sentences "
        f"({report['words']:,} words), one Doc each, the pipeline's batch size; every variant "
        f"in each of {report['rounds']} rounds (alternating order), the fastest round counts",
        "",
        "| variant | words/s | vs vectors |",
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
