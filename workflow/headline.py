#!/usr/bin/env python
"""The README's headline table, recomputed from the kept runs: test NER F1 of the five
pipelines (mean ± std over seeds, number of runs) and the differences that matter, each with
Welch's 95% interval (workflow/evidence/stats.py), so that no figure of it is typed by hand.

    python -m workflow.headline                       # print the table (Markdown)
    python -m workflow.headline --readme README.md    # also put it between the README's markers

`spacy project run evidence-report` writes the same table into the README (report.headline).
tests/workflow/test_headline.py checks that the README holds it and that the headline
sentences of docs/choosing.md and docs/learning-curves.md state the same differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from workflow.evidence.report import HEADLINE_MARKER, aggregate, label, size_labels
from workflow.evidence.stats import Cell, welch_interval
from workflow.markers import replace_between_markers

EVIDENCE = Path("results/evidence.json")
PIPELINES = ("baseline", "vectors", "elmo", "vectors+elmo", "transformer")
DOUBLE = " (2x steps)"
# (better, reference) at the harness's step budget, then the transformer against vectors+elmo
# with both at twice the steps (the transformer's tagger has not converged at the harness's)
DIFFERENCES = (
    ("vectors", "baseline"),
    ("elmo", "baseline"),
    ("vectors+elmo", "vectors"),
    ("transformer", "vectors+elmo"),
    ("transformer" + DOUBLE, "vectors+elmo" + DOUBLE),
)
TITLE = (
    "**NER F1** (CoNLL-2003 test set, gold tokens; mean ± std over seeds (runs); "
    "differences of the means [Welch's 95% interval])"
)


def cells(runs: Sequence[dict]) -> dict[tuple[str, int], Cell]:
    """Test NER F1 (0..1) by (row, training sentences); a row is a pipeline, with " (2x steps)"
    for runs at twice the harness's step budget (workflow.evidence.report.label)."""
    return aggregate(runs, "ents_f")


def difference(
    table: dict[tuple[str, int], Cell], better: str, reference: str, size: int
) -> tuple[float, tuple[float, float] | None] | None:
    """(mean(better) - mean(reference), Welch's 95% interval or None) in points of F1; None
    when either side has no run at `size`."""
    if (better, size) not in table or (reference, size) not in table:
        return None
    a, b = table[better, size], table[reference, size]
    interval = welch_interval(a, b)
    low_high = None if interval is None else (100 * interval[0], 100 * interval[1])
    return 100 * (a.mean - b.mean), low_high


def format_score(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    if cell.std is None:
        return f"{100 * cell.mean:.2f} ({cell.n})"
    return f"{100 * cell.mean:.2f} ± {100 * cell.std:.2f} ({cell.n})"


def format_difference(found: tuple[float, tuple[float, float] | None] | None) -> str:
    if found is None:
        return "–"
    value, interval = found
    if interval is None:
        return f"{value:+.2f}"
    return f"{value:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def difference_name(better: str, reference: str) -> str:
    if better.endswith(DOUBLE) and reference.endswith(DOUBLE):
        return f"*{better[: -len(DOUBLE)]} − {reference[: -len(DOUBLE)]}, both at 2x steps*"
    return f"*{better} − {reference}*"


def render(runs: Sequence[dict]) -> str:
    """The Markdown table: a row per pipeline of PIPELINES that has runs at the harness's step
    budget, then a row per difference of DIFFERENCES that has a value at some size."""
    table = cells(runs)
    sizes = size_labels(runs)
    rows = [
        TITLE,
        "",
        "| pipeline | " + " | ".join(sizes.values()) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    present = {label(run) for run in runs}
    for pipeline in PIPELINES:
        if pipeline in present:
            row = [format_score(table.get((pipeline, size))) for size in sizes]
            rows.append(f"| {pipeline} | " + " | ".join(row) + " |")
    for better, reference in DIFFERENCES:
        found = [difference(table, better, reference, size) for size in sizes]
        if all(item is None for item in found):
            continue
        row = [format_difference(item) for item in found]
        rows.append(f"| {difference_name(better, reference)} | " + " | ".join(row) + " |")
    return "\n".join(rows)


def load_runs(path: Path = EVIDENCE) -> list[dict]:
    """The runs of an evidence report's JSON (results/evidence.json)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"no evidence report {path} (run `spacy project run evidence-report`)"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if "runs" not in data:
        raise ValueError(
            f"{path} has no 'runs': is it the JSON of `python -m workflow.evidence report`?"
        )
    return data["runs"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evidence", type=Path, default=EVIDENCE, help=f"default {EVIDENCE}")
    parser.add_argument(
        "--readme", type=Path, help=f"a README whose {HEADLINE_MARKER} markers get the table"
    )
    args = parser.parse_args(argv)
    table = render(load_runs(args.evidence))
    print(table)
    if args.readme is not None and replace_between_markers(args.readme, HEADLINE_MARKER, table):
        print(f"[headline] updated the {HEADLINE_MARKER} section of {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
