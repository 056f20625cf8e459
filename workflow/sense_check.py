"""Top-layer cosine similarity of "bank" across sentences, with the bundled biLM (or --model);
with --page also put in that docs page between <!-- sense-check:start --> and its end marker.

python -m workflow.sense_check [--model DIR] [--page docs/model-card.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from spacy_elmo import BiLM
from workflow.markers import replace_between_markers

MARKER = "sense-check"

REFERENCE = "The river bank overflowed after heavy rain"
OTHERS = [
    ("finance", "The investment bank approved the commercial acquisition"),
    ("river", "The river bank flooded after the storm"),
    ("river", "They walked along the muddy bank of the river"),
    ("river", "Heavy rain flooded the river bank"),
    ("river", "Fish swam near the grassy bank of the stream"),
    ("finance", "The bank raised interest rates on loans"),
    ("finance", "She deposited the money at the bank"),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="saved biLM directory (default: the bundled one)")
    parser.add_argument(
        "--page", type=Path, default=None, help="a docs page (docs/model-card.md) to update"
    )
    args = parser.parse_args(argv)
    report = sense_report(BiLM.load(args.model))
    print(report)
    if args.page is not None and replace_between_markers(args.page, MARKER, report):
        print(f"updated the {MARKER} section of {args.page}")


def sense_report(bilm: BiLM) -> str:
    """The cosines of "bank" in OTHERS to the REFERENCE's, and the verdict of the check."""
    sentences = [REFERENCE] + [text for _, text in OTHERS]
    layers = bilm.embed([s.split() for s in sentences])
    vectors = [out[:, s.split().index("bank")] for out, s in zip(layers, sentences)]
    lines = [
        f"reference: {REFERENCE}",
        "| sense | sentence | cosine layer 1 | cosine layer 2 |",
        "|---|---|---|---|",
    ]
    for (sense, text), vector in zip(OTHERS, vectors[1:]):
        cosines = [cosine(a, b) for a, b in zip(vectors[0][1:], vector[1:])]
        lines.append(f"| {sense} | {text} | {cosines[0]:.3f} | {cosines[1]:.3f} |")
    top = {
        (sense, text): cosine(vectors[0][2], vector[2])
        for (sense, text), vector in zip(OTHERS, vectors[1:])
    }
    river = min((c, t) for (sense, t), c in top.items() if sense == "river")
    finance = max((c, t) for (sense, t), c in top.items() if sense == "finance")
    verdict = "holds" if river[0] > finance[0] else "fails"
    lines += [
        "",
        f"Top layer: the least similar river sentence ({river[1]!r}, {river[0]:.3f}) against "
        f"the most similar finance sentence ({finance[1]!r}, {finance[0]:.3f}): the check "
        f"{verdict}.",
    ]
    return "\n".join(lines)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


if __name__ == "__main__":
    main()
