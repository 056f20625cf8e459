"""How far the bfloat16 biLM (`spacy_elmo/bilm/quantize.py`) is from float32, layer by
layer.

Two models and texts: the AllenNLP fixture model on its 30 sentences, and the bundled biLM on
the first --sentences sentences of CoNLL-2003 test (gold tokens; examples/sentences.txt split
on spaces when the CoNLL files are absent). Zero LSTM state, batches of 32. Per layer: the
max and mean absolute error against float32 over all tokens and dimensions, the relative
error ||bf16 - float32|| / ||float32||, the lowest cosine between a token's bf16 and float32
vectors, and the largest |value| (the projection clip bounds layer 1). Usage:

    python -m benchmarks.bf16_error
    python -m benchmarks.bf16_error --fixture PATH   # the fixture folder (options.json, ...)
    python -m benchmarks.bf16_error --speed          # and the bundled biLM's speed, both ways

--speed: the bundled biLM on the first 128 of those sentences in batches of 32 and on the first
16 one at a time, float32 and bf16 alternating in one process over --rounds rounds (token
cache off), as words per wall-clock second and per CPU second of the process (the latter is
less disturbed by other jobs on the machine); the fastest round of each counts.

Writes benchmarks/results/bf16_error_cpu.{md,json}. (Until commit
96efca9ce3d7a588ac2d13270bb43d47b7462293 this was benchmarks/int8_error.py, which measured
int8 too: benchmarks/results/int8_error_cpu.md, docs/research/int8.md.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import CONLL, machine_info, write_results

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
MODES = ("bf16",)


def errors(float32: list[np.ndarray], quantised: list[np.ndarray]) -> list[dict]:
    """Per layer: max / mean abs error, relative error, lowest token cosine, largest |value|."""
    rows = []
    for layer in range(float32[0].shape[0]):
        ref = np.concatenate([f[layer] for f in float32])  # (tokens, 2P)
        got = np.concatenate([q[layer] for q in quantised])
        diff = got - ref
        cosine = (got * ref).sum(-1) / (
            np.linalg.norm(got, axis=-1) * np.linalg.norm(ref, axis=-1) + 1e-30
        )
        rows.append(
            {
                "layer": layer,
                "max_abs_error": float(np.abs(diff).max()),
                "mean_abs_error": float(np.abs(diff).mean()),
                "relative_error": float(np.linalg.norm(diff) / np.linalg.norm(ref)),
                "min_cosine": float(cosine.min()),
                "max_abs_float32": float(np.abs(ref).max()),
                "max_abs_quantised": float(np.abs(got).max()),
            }
        )
    return rows


def measure(bilm, sentences: list[list[str]], mode: str) -> list[dict]:
    from spacy_elmo.bilm.quantize import set_quantize

    float32 = bilm.embed(sentences, batch_size=32)
    set_quantize(bilm, mode)
    quantised = bilm.embed(sentences, batch_size=32)
    set_quantize(bilm, None)
    return errors(float32, quantised)


def speed(bilm, sentences: list[list[str]], rounds: int, quantised: str) -> dict:
    """Words per wall and CPU second, batch 32 and batch 1, float32 and `quantised`
    alternating."""
    import time

    from spacy_elmo.bilm.quantize import set_quantize

    bilm.token_cache_size = 0
    batch, alone = sentences[:128], sentences[:16]
    results: dict = {"float32": [], quantised: []}
    for number in range(rounds):
        for mode in ("float32", quantised) if number % 2 == 0 else (quantised, "float32"):
            set_quantize(bilm, None if mode == "float32" else mode)
            row = {}
            for name, run, words in (
                ("b32", lambda: bilm.embed(batch, batch_size=32), sum(map(len, batch))),
                ("b1", lambda: [bilm.embed([s]) for s in alone], sum(map(len, alone))),
            ):
                cpu, wall = time.process_time(), time.perf_counter()
                run()
                row[f"{name}_words_per_s"] = words / (time.perf_counter() - wall)
                row[f"{name}_words_per_cpu_s"] = words / (time.process_time() - cpu)
            results[mode].append(row)
            print(mode, {k: round(v) for k, v in row.items()}, flush=True)
    set_quantize(bilm, None)
    best = {m: {k: max(r[k] for r in rows) for k in rows[0]} for m, rows in results.items()}
    return {"rounds": results, "best": best, "sentences": [len(batch), len(alone)]}


def conll_sentences(n: int) -> tuple[str, list[list[str]]]:
    test = CONLL / "test.txt"
    if test.exists():
        from workflow.conll import read_conll

        with open(test, encoding="utf-8") as lines:
            docs = list(read_conll(lines, str(test)))
        words = [[t.word for t in s] for doc in docs for s in doc]
        return f"CoNLL-2003 test, first {min(n, len(words))} sentences", words[:n]
    path = REPO / "examples" / "sentences.txt"
    lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines()]
    return f"{path.relative_to(REPO)} (CoNLL-2003 absent)", [s for s in lines if s][:n]


def markdown(report: dict) -> str:
    m = report["machine"]
    mode = report.get("mode", "bf16")
    lines = [
        f"# {mode} against float32: the biLM's layers",
        "",
        f"- Machine: {m['cpu']}, {m['cpu_cores']} cores; torch {m['torch']}; spacy-elmo git "
        f"{m.get('git_commit', '?')}; {m['date']}",
        f"- Command: `{report['command']}`",
        "",
        "| model | text | tokens | layer | max abs error | mean abs error | relative error "
        f"| lowest cosine | max abs float32 / {mode} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if "speed" in report:  # before the error table
        sp = report["speed"]
        table_header = lines[-2:]
        del lines[-2:]
        lines += [
            "",
            f"Speed, bundled biLM, {sp['threads']} thread(s), {sp['text']}: batch 32 over "
            f"{sp['sentences'][0]} sentences, batch 1 over {sp['sentences'][1]}; float32 and "
            f"{mode} alternating, fastest of {sp['rounds_n']} rounds; the load average of the "
            f"machine was {sp['load_average']} at the start.",
            "",
            "| products | batch 32 words/s | words/CPU-s | batch 1 words/s | words/CPU-s |",
            "|---|---:|---:|---:|---:|",
        ]
        for products, b in sp["best"].items():
            lines.append(
                f"| {products} | {b['b32_words_per_s']:,.0f} | {b['b32_words_per_cpu_s']:,.0f} "
                f"| {b['b1_words_per_s']:,.0f} | {b['b1_words_per_cpu_s']:,.0f} |"
            )
        lines += ["", *table_header]
    for case in report["cases"]:
        for row in case["layers"]:
            lines.append(
                f"| {case['model']} | {case['text']} | {case['tokens']:,} | {row['layer']} "
                f"| {row['max_abs_error']:.4f} | {row['mean_abs_error']:.5f} "
                f"| {row['relative_error']:.4f} | {row['min_cosine']:.5f} "
                f"| {row['max_abs_float32']:.3f} / {row['max_abs_quantised']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixture", type=Path, default=None, help="AllenNLP fixture folder")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", choices=MODES, default="bf16")
    parser.add_argument("--output", type=Path, default=None, help="default: results/MODE_error_cpu")
    parser.add_argument("--speed", action="store_true", help="also time float32 and --mode")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    output = args.output or RESULTS / f"{args.mode}_error_cpu"

    import torch

    from spacy_elmo import BiLM

    torch.set_num_threads(args.threads)
    cases = []
    fixture = args.fixture or REPO.parent / "shared" / "fixtures" / "allennlp_elmo"
    if (fixture / "lm_weights.hdf5").exists():
        bilm = BiLM.from_allennlp(fixture / "options.json", fixture / "lm_weights.hdf5")
        with open(fixture / "sentences.json") as f:
            sentences = [s.split() for batch in json.load(f) for s in batch]
        layers = measure(bilm, sentences, args.mode)
        cases.append({"model": "AllenNLP fixture", "text": "its 30 sentences", "layers": layers})
        cases[-1]["tokens"] = sum(map(len, sentences))
    else:
        print(f"no fixture at {fixture}: skipped", file=sys.stderr)
    text, sentences = conll_sentences(args.sentences)
    bundled = BiLM.load()
    layers = measure(bundled, sentences, args.mode)
    cases.append({"model": "bundled", "text": text, "layers": layers})
    cases[-1]["tokens"] = sum(map(len, sentences))
    timing = None
    if args.speed:
        load_average = ", ".join(f"{v:.1f}" for v in os.getloadavg())
        timing = speed(bundled, sentences, args.rounds, args.mode)
        timing.update(
            threads=args.threads, text=text, rounds_n=args.rounds, load_average=load_average
        )
    report = {
        "machine": machine_info("spacy-elmo"),
        "command": "python -m benchmarks.bf16_error "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "mode": args.mode,
        "cases": cases,
        **({"speed": timing} if timing else {}),
    }
    text = markdown(report)
    write_results(output, report, text)
    print(text)


if __name__ == "__main__":
    main()
