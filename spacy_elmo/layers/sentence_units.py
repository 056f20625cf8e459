"""The biLM's input units of a doc: its sentences, cut into windows, batched by padded size.

Each doc is cut into units: its sentences when it has sentence boundaries; else, with
`split_sentences`, the sentences of spaCy's rule-based sentencizer (a sentence ends after a
token in `sentence_punct`, default `Sentencizer.default_punct_chars`, and the punctuation that
follows it), computed here and not written to the doc; else the whole doc. Units longer than
`max_tokens` are cut into windows of `max_tokens`. Whitespace tokens are not fed to the biLM.
Units are batched by padded token count, longest first.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import List, Optional, Sequence, Tuple

from spacy.attrs import IS_PUNCT, IS_SPACE, ORTH
from spacy.pipeline import Sentencizer
from spacy.tokens import Doc, Span

from ..bilm.batching import batches_by_padded_tokens


@dataclass
class Unit:
    """One biLM input sequence: token positions of one doc and their texts."""

    doc: int
    positions: Sequence[int]
    words: Tuple[str, ...]


def doc_units(
    doc: Doc,
    index: int,
    max_tokens: int,
    split_sentences: bool = False,
    sentence_punct: Optional[List[str]] = None,
) -> List[Unit]:
    """The biLM inputs of one doc: sentences (or the doc) in windows, whitespace dropped."""
    if not len(doc):
        return []
    # One pass over the doc's arrays instead of a Token object per token (twice, with the
    # sentencizer): a sizeable part of the elmo component's time on short docs.
    orths, punct, space = doc.to_array([ORTH, IS_PUNCT, IS_SPACE]).T.tolist()
    strings = doc.vocab.strings
    if doc.has_annotation("SENT_START"):
        starts = [span.start for span in doc.sents]
    elif split_sentences:
        starts = rule_sentence_starts([strings[o] for o in orths], punct, sentence_punct)
    else:
        starts = [0]
    units = []
    for start, end in zip(starts, starts[1:] + [len(doc)]):
        positions = [i for i in range(start, end) if not space[i]]
        for first in range(0, len(positions), max_tokens):
            window = positions[first : first + max_tokens]
            units.append(Unit(index, window, tuple(strings[orths[i]] for i in window)))
    return units


def rule_sentence_starts(
    texts: Sequence[str], is_punct: Sequence[int], punct_chars: Optional[List[str]] = None
) -> List[int]:
    """Where spaCy's rule-based `Sentencizer.predict` starts sentences, from the tokens' texts
    and IS_PUNCT flags: after a token in `punct_chars` and the punctuation that follows it."""
    chars = _punct_set(tuple(punct_chars) if punct_chars else None)  # [] too: the defaults
    starts, seen_period = [0], False
    for i, (text, punct) in enumerate(zip(texts, is_punct)):
        in_chars = text in chars
        if seen_period and not punct and not in_chars:
            starts.append(i)
            seen_period = False
        elif in_chars:
            seen_period = True
    return starts


def rule_sentences(doc: Doc, punct_chars: Optional[List[str]] = None) -> List[Span]:
    """The sentences spaCy's rule-based `Sentencizer` would set, as spans (doc unchanged)."""
    if not len(doc):
        return []
    starts = rule_sentence_starts([t.text for t in doc], [t.is_punct for t in doc], punct_chars)
    return [doc[start:end] for start, end in zip(starts, starts[1:] + [len(doc)])]


@lru_cache(maxsize=16)
def _punct_set(punct_chars: Optional[Tuple[str, ...]]) -> frozenset:
    """The sentence-final characters, as `Sentencizer(punct_chars=...)` takes them."""
    return frozenset(punct_chars or Sentencizer.default_punct_chars)


def batches_by_tokens(units: List[Unit], batch_tokens: int) -> List[List[Unit]]:
    """Longest first; a batch's padded size (rows x (longest + 2)) stays within batch_tokens."""
    ordered = sorted(units, key=lambda unit: -len(unit.words))
    return list(batches_by_padded_tokens(ordered, batch_tokens, length=lambda u: len(u.words)))
