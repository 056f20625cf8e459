"""One README table from several `spacy-elmo probe` outputs (one column group per model).

python -m workflow.compare_probes NAME=results/probe_stage1/probe.json NAME=results/probe/probe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spacy_elmo.probes.report import PAPER, PLURALS, report_rows

# The probes whose numbers the paper gives for the same task (its PAPER key).
WITH_PAPER = {"POS, WSJ": "pos", "WSD, WordNet examples": "wsd"}


def label(row: dict) -> str:
    """The README's name of a probe row of `spacy_elmo.probes.report.report_rows`."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probes", nargs="+", help="NAME=path/to/probe.json")
    args = parser.parse_args()
    models = []
    for item in args.probes:
        name, _, path = item.partition("=")
        models.append((name, rows(json.loads(Path(path).read_text()))))
    header = "| probe | baseline |"
    rule = "|---|---:|"
    for name, _ in models:
        header += f" {name}: layer 0 | layer 1 | layer 2 |"
        rule += "---:|---:|---:|"
    print(header + " paper: layer 1 | layer 2 |")
    print(rule + "---:|---:|")
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
        print(line)


if __name__ == "__main__":
    main()
