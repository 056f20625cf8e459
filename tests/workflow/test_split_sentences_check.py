"""workflow.split_sentences_check counts the docs the sentencizer rule would cut."""

from __future__ import annotations

import spacy
from spacy.tokens import Doc, DocBin

from workflow.split_sentences_check import count_units


def test_gold_sentences_are_not_cut_and_whole_documents_are(tmp_path):
    vocab = spacy.blank("en").vocab
    words = ["The", "river", "rose", ".", "The", "bank", "closed", "."]
    starts = [True, False, False, False, True, False, False, False]
    one_sentence = Doc(vocab, words=["Anna", "left", "."], sent_starts=[True, False, False])
    path = tmp_path / "docs.spacy"
    DocBin(docs=[Doc(vocab, words=words, sent_starts=starts), one_sentence]).to_disk(path)
    assert count_units(path, gold_preproc=True) == {
        "docs": 3,  # one per gold sentence
        "with_sentence_starts": 0,
        "cut_by_the_rule": 0,
    }
    assert count_units(path, gold_preproc=False) == {
        "docs": 2,
        "with_sentence_starts": 0,
        "cut_by_the_rule": 1,  # the two-sentence document
    }
