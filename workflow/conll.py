"""CoNLL-2003 files, read in one place for the scripts and the benchmarks.

Lines are ``token POS chunk NER`` with IOB2 NER tags, a blank line after every sentence and a
``-DOCSTART- -X- -X- O`` line before every document. `read_conll` gives the documents as
sentences of checked `Token`s; `sentence_words` the first column of every sentence, whatever
the number of columns. Plain Python (no spaCy), so that any environment can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

DOCSTART = "-DOCSTART-"
N_COLUMNS = 4  # token, POS tag, chunk tag, NER tag


class ConllError(ValueError):
    """A CoNLL file is not in the expected four-column IOB2 format."""


@dataclass
class Token:
    word: str
    tag: str
    ner: str


Sentence = list[Token]


@dataclass
class Lines:
    """One sentence as it stands in the file: its token lines, unchecked."""

    rows: list[tuple[int, str]]  # (line number, line) of every token
    end: int  # the number of the line that ended it (the blank or -DOCSTART- line, or the last)
    first_of_document: bool  # a -DOCSTART- line came after the previous sentence


def sentence_lines(lines: Iterable[str]) -> Iterator[Lines]:
    """Every sentence of ``lines``, blank lines and ``-DOCSTART-`` lines between them."""
    rows: list[tuple[int, str]] = []
    new_document = False
    number = 0
    for number, line in enumerate(lines, start=1):
        columns = line.split()
        if columns and columns[0] != DOCSTART:
            rows.append((number, line))
            continue
        if rows:
            yield Lines(rows, number, new_document)
            rows, new_document = [], False
        new_document = new_document or bool(columns)
    if rows:
        yield Lines(rows, number, new_document)


def sentence_words(lines: Iterable[str]) -> Iterator[list[str]]:
    """The words (first column) of every sentence of ``lines``; ``-DOCSTART-`` is skipped."""
    for sentence in sentence_lines(lines):
        yield [line.split()[0] for _, line in sentence.rows]


def read_conll(lines: Iterable[str], source: str = "<input>") -> Iterator[list[Sentence]]:
    """Yield the CoNLL documents in ``lines``, each a list of sentences of tokens."""
    document: list[Sentence] = []
    for sentence in sentence_lines(lines):
        if sentence.first_of_document and document:
            yield document
            document = []
        tokens = [_token(line, number, source) for number, line in sentence.rows]
        document.append(_check_iob2(tokens, source, sentence.end))
    if document:
        yield document


def read_sentences(path: Path, limit: int | None = None) -> list[Sentence]:
    """The first ``limit`` sentences (all if None) of a CoNLL file, over its documents."""
    with open(path, encoding="utf-8") as lines:
        documents = read_conll(lines, str(path))
        return list(islice((s for document in documents for s in document), limit))


def read_words(path: Path, limit: int | None = None) -> list[list[str]]:
    """The words of the first ``limit`` sentences (all if None) of a CoNLL file."""
    with open(path, encoding="utf-8") as lines:
        return list(islice(sentence_words(lines), limit))


def _token(line: str, number: int, source: str) -> Token:
    columns = line.split()
    if len(columns) != N_COLUMNS:
        raise ConllError(
            f"{source}:{number}: expected {N_COLUMNS} columns (token POS chunk NER), "
            f"got {len(columns)}: {line.rstrip()!r}"
        )
    word, tag, _chunk, ner = columns
    return Token(word, tag, ner)


def _check_iob2(sentence: Sentence, source: str, number: int) -> Sentence:
    """Every entity must start with B- (IOB2); an I- tag continues an entity of its label."""
    previous = "O"
    for token in sentence:
        prefix, _, label = token.ner.partition("-")
        if token.ner != "O" and (prefix not in ("B", "I") or not label):
            raise ConllError(f"{source}: sentence ending before line {number}: bad tag {token.ner}")
        if prefix == "I" and previous[2:] != label:
            raise ConllError(
                f"{source}: sentence ending before line {number}: {token.ner} after {previous} "
                "(expected IOB2 tags, where every entity starts with B-)"
            )
        previous = token.ner
    return sentence
