"""The learning-curve report from the run.json files: JSON (runs, means, gains with Welch's
intervals), Markdown tables, the plot, the same tables in a docs page between markers, and the
NER table in the README between its headline markers."""

from __future__ import annotations

import json
import os
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from workflow.evidence.colours import pipeline_colour
from workflow.evidence.runs import PIPELINES, STEP_SETTINGS, run_name
from workflow.evidence.stats import Cell, welch_interval
from workflow.evidence.subsets import FULL
from workflow.markers import markers, replace_between_markers

BILM_NAME = "the bundled biLM"
BILM_CARD = Path("spacy_elmo/data/en_elmo_bundled/pretrain.json")
# the gains the report shows: (pipeline, the pipeline it is compared with)
GAINS = (
    ("elmo", "baseline"),
    ("vectors+elmo", "vectors"),
    ("transformer", "elmo"),
    # the same at the second step budget, where both pipelines have runs at it
    ("transformer (2x steps)", "vectors+elmo (2x steps)"),
)
# the section of the docs page that the report rewrites: <!-- evidence:start --> ... end
MARKER = "evidence"
PAGE = Path("docs/learning-curves.md")
# the README's NER table: <!-- evidence-headline:start --> ... end
HEADLINE_MARKER = "evidence-headline"
# the docs page's list of the finished runs of LISTED_PIPELINES (the hours-long ones), one line
# each: <!-- evidence-runs:start --> ... end
RUNS_MARKER = "evidence-runs"
LISTED_PIPELINES = ("transformer",)
README = Path("README.md")
# the finished transformer runs' run.json, kept in the repository (the runs take hours)
TRANSFORMER_RUNS = Path("results/transformer_runs")
TRANSFORMER_NOTE = (
    "transformer: all-MiniLM-L6-v2 fine-tuned with the tagger and NER "
    "(configs/ner_tagger_transformer.cfg), at the step budget of the other pipelines; its "
    "cells count the runs that have finished."
)
RUN_KEYS = ("pipeline", "train_sentences", "seed", "test", "dev")


def label(run: dict) -> str:
    """The row of a run: its pipeline, with "(2x steps)" etc. for a step budget other than
    STEP_SETTINGS' for its size (a pipeline's second budget, e.g. the transformer's)."""
    standard = STEP_SETTINGS.get(run.get("size"), {}).get("max_steps")
    steps = run.get("max_steps")
    if standard is None or steps is None or steps == standard:
        return run["pipeline"]
    return f"{run['pipeline']} ({steps / standard:g}x steps)"


def run_key(run: dict) -> tuple:
    """What makes a run: pipeline, size, seed and step budget (not the folder it is in)."""
    budget = tuple(run.get(key) for key in ("max_steps", "eval_frequency", "patience"))
    return (run["pipeline"], run.get("size", run["train_sentences"]), run["seed"], budget)


def run_records(root: Path) -> list[tuple[Path, dict]]:
    """The runs of one root: every ``ROOT/*/run.json`` of a folder, or the "runs" of an earlier
    report's JSON (results/evidence.json), for runs whose folders are not on this machine."""
    if root.is_file():
        return [(root, run) for run in json.loads(root.read_text())["runs"]]
    return [(path, json.loads(path.read_text())) for path in sorted(root.glob("*/run.json"))]


def load_runs(roots: Path | Sequence[Path]) -> list[dict]:
    """The runs of each root (`run_records`), sorted by row, size and seed; a run (`run_key`)
    found in several roots is taken from the first, with a warning if the records differ."""
    roots = [roots] if isinstance(roots, Path) else list(roots)
    found: dict[tuple, tuple[Path, dict]] = {}
    for root in roots:
        for path, run in run_records(root):
            missing = [key for key in RUN_KEYS if key not in run]
            missing += [f"test.{key}" for key in ("ents_f", "tag_acc") if key not in run["test"]]
            if missing:
                raise ValueError(f"{path} has no {', '.join(missing)}; is it an evidence run.json?")
            name = run_key(run)
            if name in found:
                if found[name][1] != run:
                    warnings.warn(
                        f"{path} differs from {found[name][0]}; the report takes the first",
                        stacklevel=2,
                    )
                continue
            found[name] = (path, run)
    runs = [run for _, run in found.values()]
    if not runs:
        where = ", ".join(str(root) if root.is_file() else f"{root}/*/" for root in roots)
        raise FileNotFoundError(
            f"no run.json under {where} (run `python -m workflow.evidence runs` first)"
        )
    return sorted(runs, key=lambda r: (pipeline_rank(label(r)), r["train_sentences"], r["seed"]))


def pipeline_rank(name: str) -> tuple[int, str]:
    """Rows in the order of PIPELINES, a pipeline's other budgets right after it, others last."""
    names, base = list(PIPELINES), name.split(" (")[0]
    return (names.index(base), name) if base in names else (len(names), name)


def aggregate(
    runs: Sequence[dict], metric: str, split: str = "test"
) -> dict[tuple[str, int], Cell]:
    """``metric`` on ``split`` (test or dev) of the runs grouped by (row `label`,
    train_sentences)."""
    cells: dict[tuple[str, int], Cell] = defaultdict(lambda: Cell([]))
    for run in runs:
        cells[label(run), run["train_sentences"]].values.append(run[split][metric])
    return dict(cells)


def size_labels(runs: Sequence[dict]) -> dict[int, str]:
    """Column labels by number of training sentences ("14,041 (all)" for the full set)."""
    labels = {}
    for run in runs:
        n = run["train_sentences"]
        label = f"{n:,}"
        if run.get("size") == FULL or labels.get(n, "").endswith(f"({FULL})"):
            label += f" ({FULL})"
        labels[n] = label
    return dict(sorted(labels.items()))


def format_cell(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    if cell.std is None:
        return f"{100 * cell.mean:.2f} ({cell.n})"
    return f"{100 * cell.mean:.2f} ± {100 * cell.std:.2f} ({cell.n})"


def gain(cells: dict, better: str, reference: str, size: int) -> float | None:
    """Difference of the means (0..1) of two pipelines at one size; None if one is missing."""
    if (better, size) not in cells or (reference, size) not in cells:
        return None
    return cells[better, size].mean - cells[reference, size].mean


def gain_interval(
    cells: dict, better: str, reference: str, size: int
) -> tuple[float, float, float] | None:
    """Welch's 95% interval (low, high, df) for `gain`; None if a side is missing or too small."""
    if (better, size) not in cells or (reference, size) not in cells:
        return None
    return welch_interval(cells[better, size], cells[reference, size])


def format_interval(interval: tuple[float, ...]) -> str:
    """(low, high, ...) in 0..1 as "[+low, +high]" in points."""
    return f"[{100 * interval[0]:+.2f}, {100 * interval[1]:+.2f}]"


def markdown_table(runs: Sequence[dict], metric: str, title: str) -> str:
    cells = aggregate(runs, metric)
    labels = size_labels(runs)
    pipelines = sorted({label(run) for run in runs}, key=pipeline_rank)
    lines = [
        f"**{title}** (test set, gold tokens; mean ± std over seeds, (number of runs))",
        "",
        "| pipeline | " + " | ".join(labels.values()) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for pipeline in pipelines:
        row = [format_cell(cells.get((pipeline, size))) for size in labels]
        lines.append(f"| {pipeline} | " + " | ".join(row) + " |")
    for better, reference in GAINS:
        differences = [gain(cells, better, reference, size) for size in labels]
        if all(difference is None for difference in differences):
            continue
        row = ["–" if d is None else f"{100 * d:+.2f}" for d in differences]
        lines.append(f"| *{better} − {reference}* | " + " | ".join(row) + " |")
        intervals = [gain_interval(cells, better, reference, size) for size in labels]
        if any(interval is not None for interval in intervals):
            row = ["–" if i is None else format_interval(i) for i in intervals]
            lines.append(f"| *{better} − {reference}, 95% CI* | " + " | ".join(row) + " |")
    return "\n".join(lines)


def bilm_line(card: dict, name: str = BILM_NAME) -> str:
    """One sentence on the pretrained biLM (`name`) from its card (pretrain.json)."""
    parts = []
    if "n_parameters" in card:
        parts.append(f"{card['n_parameters'] / 1e6:.1f} M parameters")
    if "steps" in card:
        parts.append(f"{card['steps']:,} pretraining steps")
    if "tokens_seen" in card:
        parts.append(f"{card['tokens_seen'] / 1e6:.1f} M tokens seen")
    if "ppl" in card.get("held_out", {}):  # the whole held-out split (evaluate-lm)
        parts.append(f"held-out perplexity {card['held_out']['ppl']:.1f}")
    elif "dev_ppl" in card:
        parts.append(f"held-out perplexity {card['dev_ppl']:.1f}")
    if "ppl" in card.get("conll_dev", {}):
        parts.append(f"CoNLL-2003 dev text perplexity {card['conll_dev']['ppl']:.1f}")
    if card.get("stages"):
        parts.append(f"{len(card['stages'])} pretraining stages, see the model card")
    return f"ELMo: {name} (" + ", ".join(parts) + ")." if parts else ""


def render_markdown(
    runs: Sequence[dict], card: dict | None, plot: str | None = None, bilm_name: str = BILM_NAME
) -> str:
    """The evidence section: both tables, the biLM it used and the plot (a relative path)."""
    n_seeds = sorted({run["seed"] for run in runs})
    blocks = [
        markdown_table(runs, "ents_f", "NER F1"),
        markdown_table(runs, "tag_acc", "Tag accuracy"),
    ]
    pipelines = {run["pipeline"] for run in runs}
    notes = [f"{len(runs)} runs, seeds {', '.join(map(str, n_seeds))}."]
    if any(better in pipelines and reference in pipelines for better, reference in GAINS):
        notes.append(
            "Rows in italics are differences of the means, and Welch's 95% confidence "
            "intervals for them (seeds as independent runs)."
        )
    if "transformer" in pipelines:
        notes.append(TRANSFORMER_NOTE)
    notes.append(
        "Made by `spacy project run evidence` (`python -m workflow.evidence report`) from the "
        "run.json files."
    )
    if card:
        line = bilm_line(card, bilm_name)
        if line:
            notes.append(line)
    blocks.append(" ".join(notes))
    if plot:
        blocks.append(f"![Test NER F1 against training sentences]({plot})")
    return "\n\n".join(blocks) + "\n"


def summary(runs: Sequence[dict]) -> list[dict]:
    """Mean and std (0..1) of every (pipeline, size), for the JSON: test NER F1 and tag
    accuracy, and dev NER F1 (what a model is chosen on)."""
    rows = []
    f1, tags = aggregate(runs, "ents_f"), aggregate(runs, "tag_acc")
    dev_f1 = aggregate(runs, "ents_f", split="dev")
    for key in sorted(f1, key=lambda k: (pipeline_rank(k[0]), k[1])):
        rows.append(
            {
                "pipeline": key[0],
                "train_sentences": key[1],
                "n": f1[key].n,
                "test": {
                    "ents_f": {"mean": f1[key].mean, "std": f1[key].std},
                    "tag_acc": {"mean": tags[key].mean, "std": tags[key].std},
                },
                "dev": {"ents_f": {"mean": dev_f1[key].mean, "std": dev_f1[key].std}},
            }
        )
    return rows


def gains(runs: Sequence[dict]) -> list[dict]:
    """For the JSON: each GAINS pair's difference of test NER F1 means (0..1) by size, with
    Welch's 95% interval and its degrees of freedom where both sides have two runs or more."""
    cells = aggregate(runs, "ents_f")
    rows = []
    for better, reference in GAINS:
        for size in sorted({size for _, size in cells}):
            difference = gain(cells, better, reference, size)
            if difference is None:
                continue
            interval = gain_interval(cells, better, reference, size)
            rows.append(
                {
                    "pipeline": better,
                    "reference": reference,
                    "train_sentences": size,
                    "n": [cells[better, size].n, cells[reference, size].n],
                    "ents_f_gain": difference,
                    "ci95": None if interval is None else list(interval[:2]),
                    "df": None if interval is None else interval[2],
                }
            )
    return rows


def plot_curves(runs: Sequence[dict], path: Path) -> None:
    """Test NER F1 against training sentences on a log axis at the true counts, one colour per
    pipeline (`pipeline_colour`; a second step budget dashed); the mean over seeds with its std
    as an error bar, a single run as a hollow marker without one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullFormatter

    cells = aggregate(runs, "ents_f")
    labels = size_labels(runs)
    figure, axes = plt.subplots(figsize=(6.4, 4.4))
    single = False
    for pipeline in sorted({label(run) for run in runs}, key=pipeline_rank):
        colour = pipeline_colour(pipeline)
        sizes = [size for size in labels if (pipeline, size) in cells]
        means = [100 * cells[pipeline, size].mean for size in sizes]
        style = "--" if " (" in pipeline else "-"
        axes.plot(sizes, means, style, color=colour, lw=1.2, alpha=0.8, label=pipeline)
        for size, mean in zip(sizes, means):
            cell = cells[pipeline, size]
            if cell.n > 1:
                std = 100 * (cell.std or 0.0)
                axes.errorbar(size, mean, yerr=std, fmt="o", color=colour, capsize=3, ms=5)
            else:
                single = True
                axes.plot(size, mean, "o", mfc="white", mec=colour, mew=1.5, ms=6)
    axes.set_xscale("log")
    axes.set_xlim(min(labels) / 1.4, max(labels) * 1.4)
    axes.xaxis.set_major_locator(FixedLocator(list(labels)))
    axes.set_xticklabels(list(labels.values()))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("training sentences (CoNLL-2003, log scale)")
    axes.set_ylabel("test NER F1")
    axes.set_title("NER + tagger learning curves (mean ± std over seeds)")
    axes.grid(alpha=0.3, which="major")
    axes.grid(alpha=0.12, which="minor", axis="x")
    handles, names = axes.get_legend_handles_labels()
    if single:
        handles.append(Line2D([], [], ls="", marker="o", mfc="white", mec="black", mew=1.5))
        names.append("a single run (no spread)")
    axes.legend(handles, names, fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)


def relative_to(target: Path, document: Path) -> str:
    """``target`` as a link from a Markdown file at ``document``."""
    return Path(os.path.relpath(target.resolve(), document.resolve().parent)).as_posix()


def finished_runs(runs: Sequence[dict], pipelines: Sequence[str] = LISTED_PIPELINES) -> str:
    """A Markdown list of the runs of `pipelines`, in the tables' order: test NER F1 and tag
    accuracy, steps, training seconds and how many starts the resumable trainer needed."""
    lines = []
    for run in runs:
        if run["pipeline"] not in pipelines:
            continue
        budget = label(run)[len(run["pipeline"]) :]
        if "segments" in run:
            starts = len(run["segments"])
            how = f"resumable trainer, {starts} start{'s' if starts != 1 else ''}"
        else:
            how = "`spacy train`, before the resumable trainer: the same loop"
        steps = f"{run['steps']:,} steps, " if "steps" in run else ""
        seconds = f"{run['train_seconds']:,.0f} s training " if "train_seconds" in run else ""
        lines.append(
            f"- `{run_name(run['pipeline'], run.get('size', run['train_sentences']), run['seed'])}`"
            f"{budget}: test NER F1 {100 * run['test']['ents_f']:.2f}, tag "
            f"accuracy {100 * run['test']['tag_acc']:.2f}; {steps}{seconds}({how})"
        )
    return "\n".join(lines) if lines else f"(no finished {' or '.join(pipelines)} run yet)"


def headline(runs: Sequence[dict]) -> str:
    """The README's table: test NER F1 of the five pipelines at every size and the differences
    that matter, with Welch's intervals (`python -m workflow.headline` prints it)."""
    from workflow.headline import render  # it imports this module

    return render(runs)


def write_report(
    root: Path | Sequence[Path],
    json_path: Path,
    markdown_path: Path,
    plot_path: Path,
    bilm_card: Path | None = BILM_CARD,
    page: Path | None = None,
    bilm_name: str = BILM_NAME,
    readme: Path | None = None,
) -> dict:
    """Write the JSON, the Markdown, the plot, (if given) the tables in the docs page `page`
    between its MARKER markers (and the list of `finished_runs` between its RUNS_MARKER markers,
    if it has them) and the NER table in `readme` between its HEADLINE_MARKER
    markers; return the JSON. `root` is one runs folder or several (see `load_runs`)."""
    runs = load_runs(root)
    card = None
    if bilm_card is not None:
        if not bilm_card.exists():
            raise FileNotFoundError(f"no biLM card {bilm_card} (give --bilm-card)")
        card = json.loads(bilm_card.read_text())
    result = {"runs": runs, "bilm": card, "summary": summary(runs), "gains": gains(runs)}
    for path in (json_path, markdown_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    markdown = render_markdown(runs, card, relative_to(plot_path, markdown_path), bilm_name)
    markdown_path.write_text(markdown)
    plot_curves(runs, plot_path)
    print(render_markdown(runs, card, bilm_name=bilm_name))
    if page is not None:
        if not page.exists():
            raise FileNotFoundError(f"no docs page {page}")
        section = render_markdown(runs, card, relative_to(plot_path, page), bilm_name)
        if replace_between_markers(page, MARKER, section):
            print(f"[report] updated the {MARKER} section of {page}")
        if markers(RUNS_MARKER)[0] in page.read_text():
            replace_between_markers(page, RUNS_MARKER, finished_runs(runs))
            print(f"[report] updated the {RUNS_MARKER} section of {page}")
    if readme is not None:
        if not readme.exists():
            raise FileNotFoundError(f"no README {readme}")
        if replace_between_markers(readme, HEADLINE_MARKER, headline(runs)):
            print(f"[report] updated the {HEADLINE_MARKER} section of {readme}")
    print(f"[report] wrote {json_path}, {markdown_path}, {plot_path}")
    return result
