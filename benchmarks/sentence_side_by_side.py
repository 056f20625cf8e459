"""One sentence through a trained elmo pipeline in several checkouts of the package, side by
side: each round runs every checkout once in a fresh process, alternating, and the table gives
the fastest and the median round of each. A round times `nlp(doc)` on each of the first
--sentences CoNLL-2003 test sentences alone (gold tokens), three passes with the biLM's token
cache emptied before each; the round's figure is the lowest of the passes' medians.

    python -m benchmarks.sentence_side_by_side PIPELINE DIR DIR [DIR ...] [--rounds 8]

PIPELINE is a trained pipeline with an `elmo` component (e.g. a `spacy train` model-best of
configs/ner_tagger_elmo.cfg); each DIR is a checkout (e.g. `git worktree add --detach DIR
COMMIT`) whose spacy_elmo the round imports. 2 torch threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CONLL_TEST = Path(__file__).resolve().parents[1] / "assets" / "conll2003" / "test.txt"
PASSES = 3


def conll_sentences(path: Path, limit: int) -> list[list[str]]:
    """The first `limit` sentences of a CoNLL-2003 file, as words (document lines left out)."""
    sentences: list[list[str]] = [[]]
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("-DOCSTART-"):
            if sentences[-1]:
                sentences.append([])
            continue
        sentences[-1].append(line.split()[0])
    return [s for s in sentences if s][:limit]


def one_round(checkout: Path, pipeline: Path, text: Path, n_sentences: int) -> float:
    """The median ms of one sentence in the checkout's package (on PYTHONPATH), the fastest pass."""
    import spacy
    import torch
    from spacy.tokens import Doc

    import spacy_elmo
    from spacy_elmo.layers.elmo_model import get_bilm

    if not Path(spacy_elmo.__file__).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"imported {spacy_elmo.__file__}, not the package of {checkout}")
    torch.set_num_threads(2)
    nlp = spacy.load(pipeline)
    sentences = conll_sentences(text, n_sentences)
    for words in sentences[:20]:  # warm: the first calls load and compile
        nlp(Doc(nlp.vocab, words=words))
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    medians = []
    for _ in range(PASSES):
        bilm.token_cache.clear()
        times = []
        for words in sentences:
            doc = Doc(nlp.vocab, words=words)
            start = time.perf_counter()
            nlp(doc)
            times.append((time.perf_counter() - start) * 1000)
        medians.append(statistics.median(times))
    return min(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", type=Path)
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--text", type=Path, default=CONLL_TEST)
    parser.add_argument("--round-in", type=Path, help=argparse.SUPPRESS)  # a worker
    args = parser.parse_args()
    if args.round_in is not None:
        ms = one_round(args.round_in, args.pipeline, args.text, args.sentences)
        print(json.dumps(ms))
        return
    from benchmarks.common import alternating_rounds

    def arguments(checkout: Path) -> list[str]:
        return [
            str(args.pipeline.resolve()),
            *map(str, args.checkouts),
            *["--round-in", str(checkout), "--text", str(args.text.resolve())],
            *["--sentences", str(args.sentences)],
        ]

    times = alternating_rounds(__file__, args.checkouts, args.rounds, arguments)
    print("| checkout | fastest ms | median ms | rounds (ms) |\n|---|---:|---:|---|")
    for checkout, values in times.items():
        rounds = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {checkout} | {min(values):.2f} | {statistics.median(values):.2f} | {rounds} |")


if __name__ == "__main__":
    main()
