#!/usr/bin/env python
"""One table of NER F1 from pipelines of several evidence reports (`python -m workflow.evidence
report` JSON files), each row one pipeline of one file, with its gain over a reference row and
Welch's 95% interval for the gain, and the gain over the reference's runs of the same seeds
(the same training subset and initialisation: the mean of the per-seed differences).

    python -m workflow.compare_evidence --reference "baseline=results/evidence.json:baseline" \\
        "elmo, stage 3 (bundled)=results/evidence.json:elmo" \\
        "elmo, stage 5=results/stage5/evidence.json:elmo" --output results/stage5/compare.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workflow.evidence.report import aggregate, format_interval, size_labels
from workflow.evidence.report import label as row_label
from workflow.evidence.stats import Cell, welch_interval


def parse_row(text: str) -> tuple[str, Path, str]:
    """ "LABEL=FILE:PIPELINE" -> (label, file, pipeline)."""
    label, equals, rest = text.partition("=")
    path, colon, pipeline = rest.rpartition(":")
    if not (equals and colon and label.strip() and path and pipeline):
        raise ValueError(f"expected LABEL=FILE:PIPELINE, got {text!r}")
    return label.strip(), Path(path), pipeline


def cells(runs: list[dict], pipeline: str, split: str) -> dict[int, Cell]:
    """NER F1 on `split` by training sentences for one pipeline's runs."""
    return {n: cell for (p, n), cell in aggregate(runs, "ents_f", split).items() if p == pipeline}


def seed_scores(runs: list[dict], pipeline: str) -> dict[tuple[int, int], float]:
    """Test NER F1 by (training sentences, seed) for one row's runs (a pipeline at its
    standard step budget, or e.g. "transformer (2x steps)", as `cells` groups them)."""
    return {
        (run["train_sentences"], run["seed"]): run["test"]["ents_f"]
        for run in runs
        if row_label(run) == pipeline
    }


def compare(rows: list[tuple[str, list[dict], str]], reference: tuple[str, list[dict], str]) -> str:
    """The Markdown table: test F1 mean (dev mean) and runs per row and size, then the gains."""
    everything = [reference, *rows]
    sizes = size_labels([run for _, runs, _ in everything for run in runs])
    test = {label: cells(runs, pipeline, "test") for label, runs, pipeline in everything}
    dev = {label: cells(runs, pipeline, "dev") for label, runs, pipeline in everything}
    for label, _, pipeline in everything:
        if not test[label]:
            raise ValueError(f"row {label!r}: no runs of pipeline {pipeline!r}")
    lines = [
        "| NER F1: test mean (dev mean), runs | " + " | ".join(sizes.values()) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for label, _, _ in everything:
        row = [
            f"{100 * test[label][n].mean:.2f} ({100 * dev[label][n].mean:.2f}), {test[label][n].n}"
            if n in test[label]
            else "–"
            for n in sizes
        ]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    base = reference[0]
    for label, _, _ in rows:
        row = []
        for n in sizes:
            if n not in test[label] or n not in test[base]:
                row.append("–")
                continue
            gain = test[label][n].mean - test[base][n].mean
            interval = welch_interval(test[label][n], test[base][n])
            ci = "" if interval is None else " " + format_interval(interval)
            row.append(f"{100 * gain:+.2f}{ci}")
        lines.append(f"| *{label} − {base}, 95% CI* | " + " | ".join(row) + " |")
    base_seeds = seed_scores(reference[1], reference[2])
    for label, runs, pipeline in rows:
        own = seed_scores(runs, pipeline)
        row = []
        for n in sizes:
            shared = sorted(seed for size, seed in own if size == n and (n, seed) in base_seeds)
            if not shared:
                row.append("–")
                continue
            differences = [own[(n, seed)] - base_seeds[(n, seed)] for seed in shared]
            mean = sum(differences) / len(differences)
            row.append(f"{100 * mean:+.2f} ({len(shared)})")
        lines.append(f"| *{label} − {base}, same seeds (runs)* | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", help="LABEL=FILE:PIPELINE (a workflow.evidence JSON)")
    parser.add_argument("--reference", required=True, help="LABEL=FILE:PIPELINE of the gains")
    parser.add_argument("--output", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        loaded = []
        for text in [args.reference, *args.rows]:
            label, path, pipeline = parse_row(text)
            loaded.append((label, json.loads(path.read_text())["runs"], pipeline))
        table = compare(loaded[1:], loaded[0])
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(table, end="")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
