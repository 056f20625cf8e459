"""One table from several `spacy-elmo probe` outputs (one column group per model), printed and
with --page put in that docs page between <!-- probes:start --> and <!-- probes:end -->.

python -m workflow.compare_probes NAME=results/probe_stage1/probe.json \
    NAME=results/probe/probe.json [--page docs/model-card.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spacy_elmo.probes.report import PAPER, PLURALS, report_rows
from workflow.markers import replace_between_markers

MARKER = "probes"

# The probes whose numbers the paper gives for the same task (its PAPER key).
WITH_PAPER = {"POS, WSJ": "pos", "WSD, WordNet examples": "wsd"}


def label(row: dict) -> str:
    """The table's name of a probe row of `spacy_elmo.probes.report.report_rows`."""
    subset = row["subset"]
    if row["task"] == "pos":
        return f"POS, {subset.upper() if subset == 'wsj' else subset.title()}"
    return "WSD, WordNet examples" if subset is None else f"WSD, {PLURALS[subset]} only"


def rows(probe: dict) -> dict[str, tuple[list[float], float]]:
    """probe name -> (accuracy per layer, baseline), in percent."""
    return {
        label(row): ([100 * a for a in row["layers"]], 100 * row["baseline"])
        for row in report_rows(probe)
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probes", nargs="+", help="NAME=path/to/probe.json")
    parser.add_argument(
        "--page", type=Path, default=None, help="a docs page (docs/model-card.md) to update"
    )
    args = parser.parse_args(argv)
    models = []
    for item in args.probes:
        name, _, path = item.partition("=")
        models.append((name, rows(json.loads(Path(path).read_text()))))
    table = comparison_table(models)
    print(table)
    if args.page is not None and replace_between_markers(args.page, MARKER, table):
        print(f"updated the {MARKER} section of {args.page}")


def comparison_table(models: list[tuple[str, dict]]) -> str:
    """The Markdown table of (model name, `rows` of its probe.json) pairs, best layer in bold."""
    header = "| probe | baseline |"
    rule = "|---|---:|"
    for name, _ in models:
        header += f" {name}: layer 0 | layer 1 | layer 2 |"
        rule += "---:|---:|---:|"
    lines = [header + " paper: layer 1 | layer 2 |", rule + "---:|---:|"]
    for probe in models[0][1]:
        baseline = models[0][1][probe][1]
        line = f"| {probe} | {baseline:.1f} |"
        for _, table in models:
            layers = table[probe][0] if probe in table else [float("nan")] * 3
            best = max(layers)
            line += "".join(
                f" **{value:.1f}** |" if value == best else f" {value:.1f} |" for value in layers
            )
        if probe in WITH_PAPER:
            paper = PAPER[WITH_PAPER[probe]]
            line += f" {paper[1]} | {paper[2]} |"
        else:
            line += " | |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
