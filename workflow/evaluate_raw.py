"""Test scores on raw text (spaCy's tokenizer, no gold sentences) next to gold tokens.

    python -m workflow.evaluate_raw training/evidence/baseline_all_s0/model-best \
        training/evidence/elmo_all_s0/model-best --test corpus/conll/test.spacy

For an `elmo` pipeline it scores raw text with the pipeline's own `split_sentences` and with
the other value (true: the component cuts raw docs into sentences itself, as gold data has them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import spacy
from spacy.tokens import DocBin
from spacy.training import Corpus


def score(nlp, path: Path, gold_preproc: bool) -> dict:
    examples = list(Corpus(str(path), gold_preproc=gold_preproc)(nlp))
    return nlp.evaluate(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="+", type=Path)
    parser.add_argument("--test", type=Path, default=Path("corpus/conll/test.spacy"))
    args = parser.parse_args()
    DocBin().from_disk(args.test)  # fail early on a bad path
    print("| pipeline | input | TAG_ACC | ENTS_F |\n|---|---|---:|---:|")
    for path in args.pipelines:
        variants = [("", {})]
        saved = spacy.load(path)
        if "elmo" in saved.pipe_names:  # the pipeline's own split_sentences, then the other
            own = bool(saved.get_pipe("elmo").cfg.get("split_sentences"))
            variants = [(f", split_sentences = {str(own).lower()}", {})]
            other = {"components": {"elmo": {"split_sentences": not own}}}
            variants.append((f", split_sentences = {str(not own).lower()}", other))
        for gold in (True, False):
            for label, config in variants if not gold else variants[:1]:
                nlp = spacy.load(path, config=config)
                scores = score(nlp, args.test, gold_preproc=gold)
                kind = "gold tokens and sentences" if gold else f"raw text{label}"
                print(
                    f"| {path.parent.name} | {kind} | {100 * scores['tag_acc']:.2f} | "
                    f"{100 * scores['ents_f']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
