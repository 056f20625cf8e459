"""Character ids against hand-written rows (docs/MODEL.md §4)."""

from __future__ import annotations

import pytest
import torch

from spacy_elmo import batch_to_ids
from spacy_elmo.description.chars import token_to_char_ids


def row(*ids):
    return tuple(ids) + (261,) * (50 - len(ids))


@pytest.mark.parametrize(
    "token, expected",
    [
        ("<S>", row(259, 257, 260)),
        ("</S>", row(259, 258, 260)),
        ("é", row(259, 196, 170, 260)),
        ("", row(259, 260)),
        ("a", row(259, 98, 260)),
        (" ", row(259, 33, 260)),
        ("\t\x00", row(259, 10, 1, 260)),
        ("😀", row(259, 241, 160, 153, 129, 260)),
        ("\ud800x", row(259, 121, 260)),  # lone surrogate dropped, as errors="ignore"
    ],
)
def test_rows(token, expected):
    assert token_to_char_ids(token) == expected


def test_long_tokens_are_cut_at_48_bytes_not_characters():
    assert token_to_char_ids("a" * 1000) == (259, *[98] * 48, 260)
    cjk = "北" * 20  # 3 bytes each: the 17th character is cut after its first two bytes
    ids = token_to_char_ids(cjk)
    assert len(ids) == 50 and ids[0] == 259 and ids[-1] == 260
    assert bytes(i - 1 for i in ids[1:49]) == cjk.encode("utf-8")[:48]


def test_batch_to_ids_has_the_row_of_each_token():
    tokens = ["<S>", "</S>", "é", "", "a", " ", "\t\x00", "😀", "\ud800x", "a" * 1000, "北" * 20]
    sentences = [tokens[:4], [], tokens[4:], ["<S>x", "b"]]
    ids = batch_to_ids(sentences)
    assert ids.shape == (4, 7, 50) and ids.dtype == torch.long
    for i, sentence in enumerate(sentences):
        for j in range(7):
            want = token_to_char_ids(sentence[j]) if j < len(sentence) else (0,) * 50
            assert tuple(ids[i, j].tolist()) == want, (i, j)


def test_batch_to_ids_pads_with_zero_rows():
    ids = batch_to_ids([["a", "b"], [], ["c"]])
    assert ids.shape == (3, 2, 50) and ids.dtype == torch.long
    assert ids[1].eq(0).all() and ids[2, 1].eq(0).all()
    assert tuple(ids[0, 1].tolist()) == row(259, 99, 260)
    assert batch_to_ids([]).shape == (0, 0, 50)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("a sentence", "list of token lists"),
        (["a sentence"], "sentence 0 must be a list"),
        ([["ok"], ["fine", 3]], "token 1 of sentence 1 must be a str, got int"),
        ([[None]], "token 0 of sentence 0 must be a str, got NoneType"),
        ([[b"bytes"]], "must be a str, got bytes"),
    ],
)
def test_non_string_input_is_a_type_error(bad, message):
    with pytest.raises(TypeError, match=message):
        batch_to_ids(bad)
