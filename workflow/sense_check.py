"""Top-layer cosine similarity of "bank" across sentences, with the bundled biLM (or --model).

python -m workflow.sense_check [--model DIR]
"""

from __future__ import annotations

import argparse

import numpy as np

from spacy_elmo import BiLM
from spacy_elmo.loaders import bundled_bilm

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="saved biLM directory (default: the bundled one)")
    args = parser.parse_args()
    bilm = BiLM.load(args.model) if args.model else bundled_bilm()
    sentences = [REFERENCE] + [text for _, text in OTHERS]
    layers = bilm.embed([s.split() for s in sentences])
    vectors = [out[:, s.split().index("bank")] for out, s in zip(layers, sentences)]
    print(f"reference: {REFERENCE}")
    print("| sense | sentence | cosine layer 1 | cosine layer 2 |\n|---|---|---|---|")
    for (sense, text), vector in zip(OTHERS, vectors[1:]):
        cosines = [cosine(a, b) for a, b in zip(vectors[0][1:], vector[1:])]
        print(f"| {sense} | {text} | {cosines[0]:.3f} | {cosines[1]:.3f} |")
    top = {
        (sense, text): cosine(vectors[0][2], vector[2])
        for (sense, text), vector in zip(OTHERS, vectors[1:])
    }
    river = min((c, t) for (sense, t), c in top.items() if sense == "river")
    finance = max((c, t) for (sense, t), c in top.items() if sense == "finance")
    verdict = "holds" if river[0] > finance[0] else "fails"
    print(
        f"\nTop layer: the least similar river sentence ({river[1]!r}, {river[0]:.3f}) against "
        f"the most similar finance sentence ({finance[1]!r}, {finance[0]:.3f}): the check "
        f"{verdict}."
    )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


if __name__ == "__main__":
    main()
