"""convert_conll.py on a tiny CoNLL-2003 file written in the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from spacy.tokens import DocBin
from spacy.vocab import Vocab

from workflow import convert_conll as cc

# two CoNLL documents: 3 sentences, then 2 sentences
TINY = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O

-DOCSTART- -X- -X- O

New NNP B-NP B-LOC
York NNP I-NP I-LOC
Stock NNP I-NP B-ORG
Exchange NNP I-NP I-ORG

1 CD B-NP O
: NN|SYM O O
"""


def read_docs(path: Path) -> list:
    return list(DocBin().from_disk(path).get_docs(Vocab()))


@pytest.fixture()
def tiny_dir(tmp_path: Path) -> Path:
    source = tmp_path / "conll"
    source.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (source / name).write_text(TINY, encoding="utf-8")
    return source


def test_convert_writes_three_splits(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cc.main([str(tiny_dir), str(out), "--n-sents", "2"]) == 0
    printed = capsys.readouterr().out
    assert "dev (valid.txt" in printed
    assert "3 docs, 5 sentences, 15 tokens, 6 entities (LOC 2, MISC 1, ORG 2, PER 1)" in printed
    for split in ("train", "dev", "test"):
        docs = read_docs(out / f"{split}.spacy")
        # document 1 (3 sentences) -> 2 + 1; document 2 (2 sentences) -> 2, not merged with 1
        assert [len(list(doc.sents)) for doc in docs] == [2, 1, 2]
        first, second, third = docs
        assert first.text == "EU rejects German call . Peter Blackburn"
        assert [t.whitespace_ for t in first][-2:] == [" ", ""]
        assert [t.tag_ for t in first] == ["NNP", "VBZ", "JJ", "NN", ".", "NNP", "NNP"]
        assert [t.is_sent_start for t in first] == [True] + [False] * 4 + [True, False]
        assert [(e.text, e.label_) for e in first.ents] == [
            ("EU", "ORG"),
            ("German", "MISC"),
            ("Peter Blackburn", "PER"),
        ]
        assert [(e.text, e.label_) for e in second.ents] == [("BRUSSELS", "LOC")]
        assert [(e.text, e.label_) for e in third.ents] == [
            ("New York", "LOC"),
            ("Stock Exchange", "ORG"),
        ]
        assert third[-1].tag_ == "NN|SYM"
        assert [t.is_sent_start for t in third] == [True, False, False, False, True, False]


def test_default_groups_whole_documents(tiny_dir, tmp_path):
    out = tmp_path / "out"
    assert cc.main([str(tiny_dir), str(out)]) == 0
    docs = read_docs(out / "train.spacy")
    assert [len(doc) for doc in docs] == [9, 6]
    assert [len(list(doc.sents)) for doc in docs] == [3, 2]


def test_limit_keeps_first_sentences(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cc.main([str(tiny_dir), str(out), "--limit", "4"]) == 0
    assert "2 docs, 4 sentences, 13 tokens" in capsys.readouterr().out
    docs = read_docs(out / "test.spacy")
    assert [len(list(doc.sents)) for doc in docs] == [3, 1]
    assert docs[1].text == "New York Stock Exchange"


def test_rejects_iob1_and_bad_lines():
    with pytest.raises(cc.ConllError, match="IOB2"):
        list(cc.read_conll(["Peter NNP B-NP I-PER\n"]))
    with pytest.raises(cc.ConllError, match="IOB2"):
        list(cc.read_conll(["Peter NNP B-NP B-PER\n", "York NNP I-NP I-LOC\n"]))
    with pytest.raises(cc.ConllError, match="4 columns"):
        list(cc.read_conll(["Peter NNP B-PER\n"]))


def test_missing_input_file(tmp_path, capsys):
    assert cc.main([str(tmp_path), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "train.txt" in error and "`spacy project run fetch-conll-assets`" in error
    assert "assets/archives/conll2003/" in error and "`spacy project assets`" in error
