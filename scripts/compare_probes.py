"""One README table from several `spacy-elmo probe` outputs (one column group per model).

python scripts/compare_probes.py NAME=results/probe_stage1/probe.json NAME=results/probe/probe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PAPER = {"pos": (None, 97.3, 96.8), "wsd": (None, 67.4, 69.0)}


def rows(probe: dict) -> dict[str, tuple[list[float], float]]:
    """probe name -> (accuracy per layer, baseline), in percent."""
    table = {}
    for corpus, result in probe.get("pos", {}).items():
        table[f"POS, {corpus.upper() if corpus == 'wsj' else corpus.title()}"] = (
            [100 * a for a in result["layers"]],
            100 * result["baseline_most_frequent_tag"],
        )
    if "wsd" in probe:
        wsd = probe["wsd"]
        table["WSD, WordNet examples"] = (
            [100 * a for a in wsd["layers"]],
            100 * wsd["baseline_most_frequent_sense"],
        )
        names = {"noun": "nouns", "verb": "verbs", "adj": "adjectives", "adv": "adverbs"}
        for pos, result in wsd.get("by_pos", {}).items():
            table[f"WSD, {names.get(pos, pos)} only"] = (
                [100 * a for a in result["layers"]],
                100 * result["baseline_most_frequent_sense"],
            )
    return table


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
        paper = PAPER["pos" if probe.startswith("POS") else "wsd"]
        if probe in ("POS, WSJ", "WSD, WordNet examples"):
            line += f" {paper[1]} | {paper[2]} |"
        else:
            line += " | |"
        print(line)


if __name__ == "__main__":
    main()
