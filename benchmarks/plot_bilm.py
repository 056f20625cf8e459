#!/usr/bin/env python
"""Grouped bar chart of batch-32 tokens/s per architecture, spacy-elmo vs AllenNLP.

    python -m benchmarks.plot_bilm [benchmarks/results/bilm_cpu.json] [docs/bilm_throughput.png]

Reads the JSON written by bench_bilm.py (project venv: matplotlib is there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
COLORS = {"spacy-elmo": "#2a7ab0", "allennlp": "#c9752a", "spacy-elmo-cpu": "#8aa1b1"}


def plot(results_file: Path, output: Path) -> None:
    report = json.loads(results_file.read_text())
    archs = list(report["results"])
    impls = report["settings"].get("impls", ["spacy-elmo", "allennlp"])
    impls = [i for i in impls if any(i in report["results"][a] for a in archs)]
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for k, impl in enumerate(impls):
        xs, ys = [], []
        for i, arch in enumerate(archs):
            entry = report["results"][arch].get(impl)
            if entry:
                xs.append(i + (k - (len(impls) - 1) / 2) * width)
                ys.append(entry["b32_tokens_per_s"])
        bars = ax.bar(xs, ys, width, label=impl, color=COLORS.get(impl))
        ax.bar_label(bars, labels=[f"{y:,.0f}" for y in ys], fontsize=8, padding=2)
    labels = []
    for arch in archs:
        entry = report["results"][arch]
        label = f"{arch}\n{entry['weights']['n_parameters'] / 1e6:.1f}M"
        if len(impls) == 2 and all(i in entry for i in impls):
            ratio = entry[impls[0]]["b32_tokens_per_s"] / entry[impls[1]]["b32_tokens_per_s"]
            label += f"  ({ratio:.1f}x)"
        labels.append(label)
    ax.set_xticks(range(len(archs)), labels)
    ax.set_yscale("log")  # architectures differ 20x in speed; the ratios stay comparable
    ax.set_ylabel("tokens / s, batch 32 (log scale)")
    machine = report["machine"]
    device = report["settings"]["device"]
    where = (
        machine.get("gpu")
        if device != "cpu" and machine.get("gpu")
        else (f"{machine['cpu']}, {report['settings']['threads']} threads")
    )
    ax.set_title(
        f"ELMo biLM throughput: {where}\ntorch {machine['torch']}, {machine['date'][:10]}",
        fontsize=10,
    )
    ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(y=0.2)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    print(f"wrote {output}")


if __name__ == "__main__":
    args = sys.argv[1:]
    results = Path(args[0]) if args else HERE / "results" / "bilm_cpu.json"
    out = Path(args[1]) if len(args) > 1 else HERE.parent / "docs" / "bilm_throughput.png"
    plot(results, out)
