"""Would `split_sentences` change what the elmo component reads in training and evaluation?

For every example spaCy's `Corpus` makes from a .spacy file with `gold_preproc = true` (as
configs/ner_tagger_elmo.cfg trains and the learning curves evaluate), count the predicted docs
with sentence starts (read by their sentences either way) and those without that the
sentencizer rule of `split_sentences` cuts into more than one unit. A count of 0 cut docs means
the component reads the same units with the setting on or off.

python -m workflow.split_sentences_check corpus/conll/train.spacy corpus/conll/dev.spacy ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import spacy
from spacy.pipeline import Sentencizer
from spacy.training import Corpus


def count_units(path: Path, gold_preproc: bool = True) -> dict[str, int]:
    """docs, docs with sentence starts, and docs without them that the rule cuts."""
    nlp = spacy.blank("en")
    sentencizer = Sentencizer()  # the rule of `split_sentences` (tests/pipeline hold them equal)
    counts = {"docs": 0, "with_sentence_starts": 0, "cut_by_the_rule": 0}
    for example in Corpus(str(path), gold_preproc=gold_preproc, max_length=0)(nlp):
        doc = example.predicted
        counts["docs"] += 1
        if doc.has_annotation("SENT_START"):
            counts["with_sentence_starts"] += 1
        elif sum(sentencizer.predict([doc])[0]) > 1:
            counts["cut_by_the_rule"] += 1
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help=".spacy files")
    parser.add_argument(
        "--no-gold-preproc", dest="gold_preproc", action="store_false", help="whole docs"
    )
    args = parser.parse_args(argv)
    print("| file | docs | with sentence starts | cut by the rule |\n|---|---:|---:|---:|")
    for path in args.paths:
        c = count_units(path, args.gold_preproc)
        print(f"| {path} | {c['docs']} | {c['with_sentence_starts']} | {c['cut_by_the_rule']} |")


if __name__ == "__main__":
    main()
