"""The probes' report: probe.json, probe.md (our accuracy per layer next to the paper's) and
probe.png, and the rows that `workflow/compare_probes.py` puts side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

# Peters et al. 2018, table 5 (WSD, SemCor -> Senseval/SemEval all-words F1) and table 6 (POS,
# WSJ, full training set), for the biLM's first and second LSTM layer.
PAPER = {"pos": {1: 97.3, 2: 96.8}, "wsd": {1: 67.4, 2: 69.0}}


def markdown_report(result: dict) -> str:
    """probe.md: our accuracy per layer next to the paper's numbers."""
    rows = report_rows(result)
    n_layers = len(rows[0]["layers"])  # one biLM: every probe has its layers
    layer_heads = " | ".join(f"layer {k}" for k in range(n_layers))
    lines = [
        f"# biLM layer probes ({result['model']})",
        "",
        "Accuracy (%) per biLM layer (0: char-CNN token vector, 1 and 2: LSTM layers), next to "
        "the context-free baseline and the numbers of Peters et al. (2018), section 5.3.",
        "",
        f"| probe | {layer_heads} | baseline | test items | paper layer 1 | paper layer 2 |",
        "|" + "---|" * (n_layers + 5),
    ]
    for row in rows:
        cells = " | ".join(f"{100 * a:.1f}" for a in row["layers"])
        paper = PAPER.get(row["paper"], {1: "", 2: ""})
        lines.append(
            f"| {row['name']} | {cells} | {100 * row['baseline']:.1f} "
            f"({row['baseline_name']}) | {row['n_test']:,} | {paper[1]} | {paper[2]} |"
        )
    lines += [
        "",
        "The paper's POS numbers are for the full WSJ training set, its WSD numbers all-words F1 "
        "trained on SemCor and tested on Senseval/SemEval; the data here differ (a WSJ sample, "
        "a Brown sample, WordNet's example sentences), so only the ordering of the layers "
        "compares, not the numbers.",
        "",
    ]
    lines += [f"- {task}: {note}" for task, note in result.get("notes", {}).items()]
    return "\n".join(lines) + "\n"


PLURALS = {"noun": "nouns", "verb": "verbs", "adj": "adjectives", "adv": "adverbs"}


def report_rows(result: dict) -> list[dict]:
    """One row per probe of a `run_probes` result: its name, task ("pos" or "wsd") and subset
    (the POS corpus; for WSD None, or the part of speech of the targets), the accuracy per
    layer, the baseline and its name, the number of test items and the PAPER key (or None)."""
    rows = [
        _row(f"POS {corpus}", "pos", corpus, pos, paper="pos")
        for corpus, pos in result.get("pos", {}).items()
    ]
    if "wsd" in result:
        wsd = result["wsd"]
        rows.append(_row("WSD WordNet examples", "wsd", None, wsd, paper="wsd"))
        rows += [
            _row(f"WSD, {PLURALS[tag]} only", "wsd", tag, part, paper=None)
            for tag, part in wsd.get("by_pos", {}).items()
        ]
    return rows


# task -> (its result's baseline key, the baseline's name, its result's test-count key)
_BASELINES = {
    "pos": ("baseline_most_frequent_tag", "most frequent tag", "n_test_tokens"),
    "wsd": ("baseline_most_frequent_sense", "most frequent sense", "n_test"),
}


def _row(name: str, task: str, subset: Optional[str], part: dict, paper: Optional[str]) -> dict:
    baseline, baseline_name, n_test = _BASELINES[task]
    return dict(
        name=name,
        task=task,
        subset=subset,
        layers=part["layers"],
        baseline=part[baseline],
        baseline_name=baseline_name,
        n_test=part[n_test],
        paper=paper,
    )


def plot_report(result: dict, path: Path) -> None:
    """probe.png: POS accuracy per layer (one panel) and WSD (another), baselines dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in report_rows(result) if row["paper"] is not None]  # not WSD by POS
    figure, (pos_axes, wsd_axes) = plt.subplots(1, 2, figsize=(9, 3.6))
    for row in rows:
        axes = pos_axes if row["task"] == "pos" else wsd_axes
        layers = range(len(row["layers"]))
        (line,) = axes.plot(layers, [100 * a for a in row["layers"]], "o-", label=row["name"])
        axes.axhline(
            100 * row["baseline"],
            linestyle="--",
            color=line.get_color(),
            label=f"{row['name']}: {row['baseline_name']}",
        )
    if "wsd" in result:
        chance = 100 * result["wsd"]["baseline_random_sense"]
        wsd_axes.axhline(chance, linestyle=":", color="grey", label="random sense")
    for axes, title in ((pos_axes, "POS tagging (linear probe)"), (wsd_axes, "WSD (1-NN)")):
        axes.set_title(title)
        axes.set_xlabel("biLM layer")
        axes.set_ylabel("accuracy (%)")
        axes.set_xticks(range(len(rows[0]["layers"])))
        if axes.has_data():
            axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(result: dict, output: Path) -> list[Path]:
    """probe.json, probe.md and (when matplotlib is installed) probe.png under `output`."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "probe.json", output / "probe.md"]
    written[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    written[1].write_text(markdown_report(result), encoding="utf-8")
    try:
        plot_report(result, output / "probe.png")
    except ImportError:
        import warnings

        from ..util.extras import install_hint

        hint = install_hint("pretrain", "matplotlib")
        warnings.warn(f"matplotlib is not installed: no probe.png; {hint}", stacklevel=2)
    else:
        written.append(output / "probe.png")
    return written
