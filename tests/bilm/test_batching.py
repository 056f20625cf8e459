"""Batching by padded tokens, against the plain loops each caller used to write."""

from __future__ import annotations

import random

import pytest

from spacy_elmo.description.chars import batches_by_padded_tokens


def random_sentences(seed: int, n: int = 300) -> list[list[str]]:
    rng = random.Random(seed)
    return [["w"] * rng.choice([1, 2, 3, 5, 8, 20, 60, 200]) for _ in range(n)]


def reference_streaming(sentences, batch_tokens, max_sentences=None):
    """Sentences in their order; the padded width is the longest so far in the batch."""
    batches, batch = [], []
    for sentence in sentences:
        width = max([len(s) for s in batch] + [len(sentence)]) + 2
        too_many = max_sentences is not None and len(batch) >= max_sentences
        if batch and (width * (len(batch) + 1) > batch_tokens or too_many):
            batches.append(batch)
            batch = []
        batch.append(sentence)
    return batches + ([batch] if batch else [])


def reference_longest_first(sentences, batch_tokens):
    """Sentences sorted longest first; the first of a batch sets its width."""
    batches = []
    for sentence in sorted(sentences, key=lambda s: -len(s)):
        if batches and (len(batches[-1]) + 1) * (len(batches[-1][0]) + 2) <= batch_tokens:
            batches[-1].append(sentence)
        else:
            batches.append([sentence])
    return batches


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batch_tokens", [1, 64, 256, 4096])
def test_same_batches_as_the_reference_loops(seed, batch_tokens):
    sentences = random_sentences(seed)
    for order in (sentences, sorted(sentences, key=len)):
        got = list(batches_by_padded_tokens(order, batch_tokens))
        assert got == reference_streaming(order, batch_tokens)
        got = list(batches_by_padded_tokens(order, batch_tokens, max_items=7))
        assert got == reference_streaming(order, batch_tokens, max_sentences=7)
    longest_first = sorted(sentences, key=lambda s: -len(s))
    assert list(batches_by_padded_tokens(longest_first, batch_tokens)) == (
        reference_longest_first(sentences, batch_tokens)
    )


def test_every_batch_fits_unless_one_sentence_alone_is_too_long():
    sentences = random_sentences(3)
    batches = list(batches_by_padded_tokens(sentences, 100, max_items=4))
    assert [s for batch in batches for s in batch] == sentences
    for batch in batches:
        padded = len(batch) * (max(len(s) for s in batch) + 2)
        assert len(batch) <= 4 and (padded <= 100 or len(batch) == 1)
    assert list(batches_by_padded_tokens([], 100)) == []
    units = [("a", ["x"] * 3), ("b", ["x"] * 5)]
    assert list(batches_by_padded_tokens(units, 14, length=lambda u: len(u[1]))) == [
        [units[0], units[1]]
    ]
