"""workflow/conll.py, the one CoNLL-2003 reader of the scripts and benchmarks."""

from __future__ import annotations

import pytest

from workflow import conll

# two documents: two sentences, then one; blank lines doubled and a trailing sentence
TEXT = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O


Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
-DOCSTART- -X- -X- O

New NNP B-NP B-LOC
York NNP I-NP I-LOC"""


def test_documents_of_sentences_of_tokens():
    documents = list(conll.read_conll(TEXT.splitlines(keepends=True)))
    words = [[[token.word for token in sentence] for sentence in doc] for doc in documents]
    assert words == [[["EU", "rejects"], ["Peter", "Blackburn"]], [["New", "York"]]]
    peter = documents[0][1][0]
    assert (peter.word, peter.tag, peter.ner) == ("Peter", "NNP", "B-PER")


def test_words_of_any_number_of_columns():
    assert list(conll.sentence_words(TEXT.splitlines())) == [
        ["EU", "rejects"],
        ["Peter", "Blackburn"],
        ["New", "York"],
    ]
    assert list(conll.sentence_words(["a x", "b", "", "-DOCSTART- O", "c y z"])) == [
        ["a", "b"],
        ["c"],
    ]


def test_first_sentences_of_a_file_over_documents(tmp_path):
    path = tmp_path / "valid.txt"
    path.write_text(TEXT, encoding="utf-8")
    assert conll.read_words(path, 2) == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert conll.read_words(path) == conll.read_words(path, 10)
    assert [[t.ner for t in s] for s in conll.read_sentences(path, 3)] == [
        ["B-ORG", "O"],
        ["B-PER", "I-PER"],
        ["B-LOC", "I-LOC"],
    ]


def test_errors_name_the_line():
    lines = TEXT.splitlines(keepends=True)
    bad_columns = lines[:3] + ["rejects VBZ O\n"] + lines[4:]
    with pytest.raises(conll.ConllError, match=r"<input>:4: expected 4 columns .* got 3"):
        list(conll.read_conll(bad_columns))
    iob1 = lines[:7] + ["Blackburn NNP I-NP I-LOC\n"] + lines[8:]
    with pytest.raises(conll.ConllError, match="sentence ending before line 9: I-LOC after B-PER"):
        list(conll.read_conll(iob1, "x.txt"))
