"""How far the int8 biLM (`spacy_elmo/bilm/quantize.py`) is from float32, layer by layer.

Two models and texts: the AllenNLP fixture model on its 30 sentences, and the bundled biLM on
the first --sentences sentences of CoNLL-2003 test (gold tokens; examples/sentences.txt split
on spaces when the CoNLL files are absent). Zero LSTM state, batches of 32. Per layer: the
max and mean absolute error against float32 over all tokens and dimensions, the relative
error ||int8 - float32|| / ||float32||, the lowest cosine between a token's int8 and float32
vectors, and the largest |value| (the projection clip bounds layer 1). Usage:

    python -m benchmarks.int8_error
    python -m benchmarks.int8_error --fixture PATH   # the fixture folder (options.json, ...)

Writes benchmarks/results/int8_error_cpu.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import CONLL, machine_info

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUTPUT = HERE / "results" / "int8_error_cpu"


def errors(float32: list[np.ndarray], int8: list[np.ndarray]) -> list[dict]:
    """Per layer: max / mean abs error, relative error, lowest token cosine, largest |value|."""
    rows = []
    for layer in range(float32[0].shape[0]):
        ref = np.concatenate([f[layer] for f in float32])  # (tokens, 2P)
        got = np.concatenate([q[layer] for q in int8])
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
                "max_abs_int8": float(np.abs(got).max()),
            }
        )
    return rows


def measure(bilm, sentences: list[list[str]]) -> list[dict]:
    from spacy_elmo.bilm.quantize import set_quantize

    float32 = bilm.embed(sentences, batch_size=32)
    set_quantize(bilm, "int8")
    int8 = bilm.embed(sentences, batch_size=32)
    set_quantize(bilm, None)
    return errors(float32, int8)


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
    lines = [
        "# int8 against float32: the biLM's layers",
        "",
        f"- Machine: {m['cpu']}, {m['cpu_cores']} cores; torch {m['torch']}; spacy-elmo git "
        f"{m.get('git_commit', '?')}; {m['date']}",
        f"- Command: `{report['command']}`",
        "",
        "| model | text | tokens | layer | max abs error | mean abs error | relative error "
        "| lowest cosine | max abs float32 / int8 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in report["cases"]:
        for row in case["layers"]:
            lines.append(
                f"| {case['model']} | {case['text']} | {case['tokens']:,} | {row['layer']} "
                f"| {row['max_abs_error']:.4f} | {row['mean_abs_error']:.5f} "
                f"| {row['relative_error']:.4f} | {row['min_cosine']:.5f} "
                f"| {row['max_abs_float32']:.3f} / {row['max_abs_int8']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixture", type=Path, default=None, help="AllenNLP fixture folder")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)

    import torch

    from spacy_elmo import BiLM

    torch.set_num_threads(args.threads)
    cases = []
    fixture = args.fixture or REPO.parent / "shared" / "fixtures" / "allennlp_elmo"
    if (fixture / "lm_weights.hdf5").exists():
        bilm = BiLM.from_allennlp(fixture / "options.json", fixture / "lm_weights.hdf5")
        with open(fixture / "sentences.json") as f:
            sentences = [s.split() for batch in json.load(f) for s in batch]
        layers = measure(bilm, sentences)
        cases.append({"model": "AllenNLP fixture", "text": "its 30 sentences", "layers": layers})
        cases[-1]["tokens"] = sum(map(len, sentences))
    else:
        print(f"no fixture at {fixture}: skipped", file=sys.stderr)
    text, sentences = conll_sentences(args.sentences)
    layers = measure(BiLM.bundled(), sentences)
    cases.append({"model": "bundled", "text": text, "layers": layers})
    cases[-1]["tokens"] = sum(map(len, sentences))
    report = {
        "machine": machine_info("spacy-elmo"),
        "command": "python -m benchmarks.int8_error "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "cases": cases,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
