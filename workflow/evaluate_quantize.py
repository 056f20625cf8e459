"""Test scores of trained elmo pipelines with the biLM in float32 and in bfloat16 at inference.

    python -m workflow.evaluate_quantize training/evidence/elmo_1000_s0 ... --modes bf16 \
        --json results/bf16/evaluate.json --markdown results/bf16/evaluate.md

Each run folder's model-best is loaded as trained and once per mode of --modes (default bf16)
with `components.elmo.quantize` set to it, and scored on the test set with gold tokens (as
`spacy evaluate --gold-preproc` scores it); the float32 score is checked against the run's own
run.json where there is one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from spacy_elmo.util.files import write_text

QUANTIZE_MODES = ("bf16",)


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
    parser.add_argument("--modes", nargs="+", choices=QUANTIZE_MODES, default=["bf16"])
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for run in args.runs:
        row = {"run": run.name}
        for mode in ["float32", *args.modes]:
            row[mode] = score(run / "model-best", args.test, None if mode == "float32" else mode)
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
    write_text(args.markdown, markdown(rows, args.modes))
    return 0


def markdown(rows: list[dict], modes: list[str]) -> str:
    """One row per run: NER F1 and tag accuracy in float32 and in each mode, and words/s."""
    header = ["run", "NER F1 float32"]
    for mode in modes:
        header += [f"NER F1 {mode}", f"{mode} − float32"]
    header += ["tag acc float32", *[f"tag acc {mode}" for mode in modes]]
    header += ["words/s float32", *[f"words/s {mode}" for mode in modes]]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for row in rows:
        f32 = row["float32"]
        cells = [row["run"], f"{100 * f32['ents_f']:.2f}"]
        for mode in modes:
            cells += [
                f"{100 * row[mode]['ents_f']:.2f}",
                f"{100 * (row[mode]['ents_f'] - f32['ents_f']):+.2f}",
            ]
        cells += [f"{100 * row[mode]['tag_acc']:.2f}" for mode in ["float32", *modes]]
        cells += [f"{row[mode]['words_per_second']:,}" for mode in ["float32", *modes]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
