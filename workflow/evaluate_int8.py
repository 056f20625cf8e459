"""Test scores of trained elmo pipelines with the biLM in float32 and in int8 at inference.

    python -m workflow.evaluate_int8 training/evidence_v6/elmo_all_s0 ... \
        --json results/teacher/int8.json --markdown results/teacher/int8.md

Each run folder's model-best is loaded twice, as trained and with `components.elmo.quantize =
"int8"`, and scored on the test set with gold tokens (as `spacy evaluate --gold-preproc`
scores it); the float32 score is checked against the run's own run.json where there is one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from spacy_elmo.util.files import write_text

MODES = {"float32": None, "int8": "int8"}


def score(model: Path, test: Path, quantize: str | None) -> dict:
    import spacy
    from spacy.training import Corpus

    nlp = spacy.load(model, config={"components": {"elmo": {"quantize": quantize}}})
    examples = list(Corpus(str(test), gold_preproc=True)(nlp))
    start = time.perf_counter()
    scores = nlp.evaluate(examples)
    seconds = time.perf_counter() - start
    words = sum(len(example.reference) for example in examples)
    return {
        "ents_f": scores["ents_f"],
        "tag_acc": scores["tag_acc"],
        "seconds": round(seconds, 1),
        "words_per_second": round(words / seconds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with model-best/")
    parser.add_argument("--test", type=Path, default=Path("corpus/conll/test.spacy"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for run in args.runs:
        row = {"run": run.name}
        for mode, quantize in MODES.items():
            row[mode] = score(run / "model-best", args.test, quantize)
            print(f"{run.name} {mode}: {row[mode]}", flush=True)
        recorded = run / "run.json"
        if recorded.exists():
            expected = json.loads(recorded.read_text())["test"]["ents_f"]
            if abs(expected - row["float32"]["ents_f"]) > 1e-6:
                raise SystemExit(
                    f"{run}: float32 NER F1 {row['float32']['ents_f']:.6f} is not run.json's "
                    f"{expected:.6f}: the harness does not score as spacy evaluate does"
                )
        rows.append(row)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.json, json.dumps({"test": str(args.test), "runs": rows}, indent=2) + "\n")
    lines = [
        "| run | NER F1 float32 | NER F1 int8 | int8 − float32 | tag acc float32 | tag acc int8 "
        "| words/s float32 | words/s int8 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        f32, i8 = row["float32"], row["int8"]
        lines.append(
            f"| {row['run']} | {100 * f32['ents_f']:.2f} | {100 * i8['ents_f']:.2f} | "
            f"{100 * (i8['ents_f'] - f32['ents_f']):+.2f} | {100 * f32['tag_acc']:.2f} | "
            f"{100 * i8['tag_acc']:.2f} | {f32['words_per_second']:,} | "
            f"{i8['words_per_second']:,} |"
        )
    write_text(args.markdown, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
