"""The biLM's input units of a doc: its sentences, cut into windows, batched by padded size.

Each doc is cut into units: its sentences when it has sentence boundaries; else, with
`split_sentences`, the sentences of spaCy's rule-based sentencizer (a sentence ends after a
token in `sentence_punct`, default `Sentencizer.default_punct_chars`, and the punctuation that
follows it), computed here and not written to the doc; else the whole doc. Units longer than
`max_tokens` are cut into windows of `max_tokens`. Whitespace tokens are not fed to the biLM.
Units are batched by padded token count, longest first.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

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
    if doc.has_annotation("SENT_START"):
        spans = list(doc.sents)
    elif split_sentences:
        spans = rule_sentences(doc, sentence_punct)
    else:
        spans = [doc[:]]
    units = []
    for span in spans:
        positions = [token.i for token in span if not token.is_space]
        for start in range(0, len(positions), max_tokens):
            window = positions[start : start + max_tokens]
            units.append(Unit(index, window, tuple(doc[i].text for i in window)))
    return units


def rule_sentences(doc: Doc, punct_chars: Optional[List[str]] = None) -> List[Span]:
    """The sentences spaCy's rule-based `Sentencizer` would set, as spans (doc unchanged)."""
    starts = Sentencizer(punct_chars=punct_chars).predict([doc])[0]
    boundaries = [i for i, is_start in enumerate(starts) if is_start] + [len(doc)]
    return [doc[start:end] for start, end in zip(boundaries, boundaries[1:])]


def batches_by_tokens(units: List[Unit], batch_tokens: int) -> List[List[Unit]]:
    """Longest first; a batch's padded size (rows x (longest + 2)) stays within batch_tokens."""
    ordered = sorted(units, key=lambda unit: -len(unit.words))
    return list(batches_by_padded_tokens(ordered, batch_tokens, length=lambda u: len(u.words)))
