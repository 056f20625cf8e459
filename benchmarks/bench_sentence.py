"""Where one sentence's time goes in the elmo pipeline, beside the baseline pipeline's.

Both trained pipelines (by default the seed-0 1,000-sentence evidence runs,
`training/evidence/{baseline,elmo}_1000_s0/model-best`; `--model NAME=PATH` names others) run
`nlp(doc)` on each of the first --sentences CoNLL-2003 test sentences alone, one component at a
time, in --rounds rounds; the fastest round counts. Then, for the elmo pipeline's biLM alone on
the same sentences (its token cache warm, as in a running service): the whole forward pass,
its char CNN, its LSTM stacks, and the torch operators of the forward pass by self time
(`torch.profiler`, which slows every operator down by a similar few microseconds, so read its
column as shares, not as times). Usage:

    python -m benchmarks.bench_sentence --threads 2      # about 2 minutes

Writes benchmarks/results/sentence_cpu.{json,md} (--output).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.common import REPO, machine_info, shown_path, write_results

DEFAULT_MODELS = {
    "baseline": REPO / "training/evidence/baseline_1000_s0/model-best",
    "elmo": REPO / "training/evidence/elmo_1000_s0/model-best",
}
TOP_OPERATORS = 12


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--test", type=Path, default=REPO / "assets/conll2003/test.txt")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks/results/sentence_cpu")
    args = parser.parse_args(argv)
    models = dict(DEFAULT_MODELS)
    for item in args.model:
        name, _, path = item.partition("=")
        if name not in models or not path:
            parser.error(f"--model takes baseline=PATH or elmo=PATH, got {item!r}")
        models[name] = Path(path)
    for name, path in models.items():
        if not (path / "config.cfg").exists():
            raise SystemExit(
                f"no trained {name} pipeline at {path}: train it with `python -m workflow.evidence "
                f"runs --pipelines {name} --sizes 1000 --seeds 0`, or name one with --model"
            )

    import torch

    torch.set_num_threads(args.threads)
    from benchmarks.bench_pipeline import test_documents

    sentences = [s for doc in test_documents(args.test) for s in doc][: args.sentences]
    report = {
        "machine": machine_info("spacy", "thinc"),
        "threads": args.threads,
        "sentences": len(sentences),
        "words": sum(map(len, sentences)),
        "rounds": args.rounds,
        "models": {name: shown_path(path) for name, path in models.items()},
        "pipelines": {
            name: per_component(path, sentences, args.rounds) for name, path in models.items()
        },
    }
    report["bilm"] = bilm_parts(models["elmo"], sentences, args.rounds)
    text = markdown(report)
    write_results(args.output, report, text)
    print(text)


def per_component(path: Path, sentences: list[list[str]], rounds: int) -> dict:
    """Mean ms per sentence of each component and of the whole pipeline, fastest round."""
    import spacy
    from spacy.tokens import Doc

    nlp = spacy.load(path)

    def doc(words: list[str]) -> Doc:
        return Doc(nlp.vocab, words=words, spaces=[True] * (len(words) - 1) + [False])

    for words in sentences[:50]:  # warm-up
        nlp(doc(words))
    best: dict | None = None
    for _ in range(rounds):
        parts = dict.fromkeys(nlp.pipe_names, 0.0)
        start = time.perf_counter()
        for words in sentences:
            current = doc(words)
            for name, component in nlp.pipeline:
                began = time.perf_counter()
                current = component(current)
                parts[name] += time.perf_counter() - began
        parts["total"] = time.perf_counter() - start
        if best is None or parts["total"] < best["total"]:
            best = parts
    assert best is not None
    return {name: seconds / len(sentences) * 1000 for name, seconds in best.items()}


def bilm_parts(path: Path, sentences: list[list[str]], rounds: int) -> dict:
    """The elmo pipeline's biLM on one sentence at a time: ms per sentence of the forward pass,
    the char CNN (token vectors, cache warm) and the LSTM stacks; the operators' shares."""
    import spacy
    import torch

    from spacy_elmo.bilm.lstm import run_stacks
    from spacy_elmo.layers.elmo_model import get_bilm

    bilm = get_bilm(spacy.load(path).get_pipe("elmo").model)
    ids = [bilm.batch_to_ids([words]) for words in sentences]
    with torch.no_grad():
        runs = [bilm._run(i, False) for i in ids]  # also warms the token cache

        def forward() -> None:
            for i in ids:
                bilm(i)

        def char_cnn() -> None:
            for i in ids:
                bilm.token_embeddings(i)

        times = {"forward": _fastest(forward, rounds), "char CNN": _fastest(char_cnn, rounds)}
        stacks = (bilm.forward_lstm, bilm.backward_lstm)
        states = [list(bilm._states_in(1)) for _ in ids]
        packed_inputs = [_packed_tokens(run) for run in runs]

        def lstm() -> None:
            for (tokens, reverse, sizes), state in zip(packed_inputs, states):
                run_stacks(stacks, [tokens, reverse], sizes, state, False)

        times["LSTM stacks"] = _fastest(lstm, rounds)
        with torch.profiler.profile() as profiler:
            forward()
    n = len(sentences)
    operators = sorted(
        profiler.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True
    )
    total = sum(event.self_cpu_time_total for event in operators)
    return {
        "ms_per_sentence": {name: seconds / n * 1000 for name, seconds in times.items()},
        "steps_per_sentence": sum(len(words) + 2 for words in sentences) / n,
        "operators": [
            {
                "name": event.key,
                "calls_per_sentence": event.count / n,
                "share": event.self_cpu_time_total / total,
            }
            for event in operators[:TOP_OPERATORS]
        ],
    }


def _packed_tokens(run) -> tuple:
    """The packed token vectors of both directions and the batch sizes of a one-sentence run."""
    tokens = run.tokens[0, : int(run.lengths[0]) + 2]  # <S> .. </S>
    return tokens, tokens.flip(0), [1] * tokens.shape[0]


def _fastest(function, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def markdown(report: dict) -> str:
    machine = report["machine"]
    pipelines = report["pipelines"]
    longest = max(pipelines.values(), key=len)  # the elmo pipeline's order: elmo first
    names = list(dict.fromkeys(n for p in (longest, *pipelines.values()) for n in p))
    names.remove("total")
    lines = [
        "# Where one sentence's time goes (CPU)",
        "",
        f"- Machine: {machine['cpu']}, {machine['cpu_cores']} cores; {report['threads']} threads",
        f"- Versions: Python {machine['python']}, torch {machine['torch']}, spaCy "
        f"{machine.get('spacy')}, thinc {machine.get('thinc')}, spacy-elmo git "
        f"{machine.get('git_commit')}",
        f"- Date: {machine['date']}",
        f"- Command: `python -m benchmarks.bench_sentence --threads {report['threads']}`",
        "- Models: " + ", ".join(f"{n} `{p}`" for n, p in report["models"].items()),
        "",
        f"`nlp(doc)` on each of the first {report['sentences']} CoNLL-2003 test sentences "
        f"({report['words'] / report['sentences']:.1f} words on average) alone; mean ms per "
        f"sentence, fastest of {report['rounds']} rounds.",
        "",
        "| pipeline | " + " | ".join(names) + " | total |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for name, parts in pipelines.items():
        cells = [f"{parts[n]:.2f}" if n in parts else "–" for n in names]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {parts['total']:.2f} |")
    bilm = report["bilm"]
    ms = bilm["ms_per_sentence"]
    lines += [
        "",
        "The elmo pipeline's biLM alone, same sentences, token cache warm (ms per sentence): "
        + ", ".join(f"{name} {value:.2f}" for name, value in ms.items())
        + f"; {bilm['steps_per_sentence']:.1f} LSTM steps a layer per sentence "
        "(the words and the two boundaries).",
        "",
        "| operator (forward pass) | calls per sentence | share of operator time |",
        "|---|---:|---:|",
    ]
    for op in bilm["operators"]:
        lines.append(f"| {op['name']} | {op['calls_per_sentence']:.1f} | {op['share']:.1%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
