"""Tokens to ELMo character ids (docs/MODEL.md §4).

Raw alphabet: bytes 0-255 are UTF-8 bytes, 256..260 are the special characters below. Every
raw id is shifted by +1 before the embedding lookup so that id 0 means "no token here".
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import torch

MAX_CHARS_PER_TOKEN = 50
MAX_BYTES_PER_TOKEN = MAX_CHARS_PER_TOKEN - 2  # room for begin- and end-of-word
BEGIN_OF_SENTENCE_CHAR = 256
END_OF_SENTENCE_CHAR = 257
BEGIN_OF_WORD_CHAR = 258
END_OF_WORD_CHAR = 259
PADDING_CHAR = 260
N_CHARACTERS = 262  # 261 raw ids + the id-0 "no token" row
BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
PADDING_ROW_ID = 0  # a whole row of this id marks a padded (absent) token


# The shifted ids as shared int objects: a cached row holds references, not 50 new ints
# (ids above 256 are not Python's cached small ints; 2 kB a row instead of 0.5 kB).
_SHIFTED = tuple(i + 1 for i in range(N_CHARACTERS - 1))


def _row(raw_ids: Sequence[int]) -> tuple[int, ...]:
    """Wrap raw ids in begin/end-of-word, pad to 50 slots and apply the +1 shift."""
    row = [BEGIN_OF_WORD_CHAR, *raw_ids, END_OF_WORD_CHAR]
    row += [PADDING_CHAR] * (MAX_CHARS_PER_TOKEN - len(row))
    return tuple(_SHIFTED[i] for i in row)


BOS_CHAR_IDS = _row([BEGIN_OF_SENTENCE_CHAR])
EOS_CHAR_IDS = _row([END_OF_SENTENCE_CHAR])


@lru_cache(maxsize=2**15)  # about 20 MB when full
def token_to_char_ids(token: str) -> tuple[int, ...]:
    """The 50 shifted character ids of one token (UTF-8 bytes truncated to 48)."""
    if token == BOS_TOKEN:
        return BOS_CHAR_IDS
    if token == EOS_TOKEN:
        return EOS_CHAR_IDS
    encoded = token.encode("utf-8", errors="ignore")[:MAX_BYTES_PER_TOKEN]
    return _row(encoded)


def check_sentences(sentences: object) -> list[list[str]]:
    """Validate a batch of pre-tokenised sentences; raise TypeError naming the bad item."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        raise TypeError(f"sentences must be a list of token lists, got {type(sentences).__name__}")
    checked = []
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, (str, bytes)) or not isinstance(sentence, Sequence):
            raise TypeError(
                f"sentence {i} must be a list of token strings, got "
                f"{type(sentence).__name__} {sentence!r:.60}"
            )
        for j, token in enumerate(sentence):
            if not isinstance(token, str):
                raise TypeError(
                    f"token {j} of sentence {i} must be a str, got "
                    f"{type(token).__name__} {token!r:.60}"
                )
        checked.append(list(sentence))
    return checked


def batch_to_ids(sentences: Sequence[Sequence[str]]) -> torch.Tensor:
    """Character ids of a batch, shape (batch, max_tokens, 50), without sentence boundaries.

    Positions past the end of a sentence are rows of 0. The biLM adds `<S>`/`</S>` itself.
    """
    sentences = check_sentences(sentences)
    width = max((len(s) for s in sentences), default=0)
    ids = torch.zeros((len(sentences), width, MAX_CHARS_PER_TOKEN), dtype=torch.long)
    for i, sentence in enumerate(sentences):
        if sentence:
            ids[i, : len(sentence)] = torch.tensor(
                [token_to_char_ids(token) for token in sentence], dtype=torch.long
            )
    return ids
