"""Tokens to ELMo character ids (docs/MODEL.md §4), and batches of sentences by padded size.

Raw alphabet: bytes 0-255 are UTF-8 bytes, 256..260 are the special characters below. Every
raw id is shifted by +1 before the embedding lookup so that id 0 means "no token here".
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar

import numpy
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


def _row(raw_ids: Sequence[int]) -> tuple[int, ...]:
    """Wrap raw ids in begin/end-of-word, pad to 50 slots and apply the +1 shift."""
    row = [BEGIN_OF_WORD_CHAR, *raw_ids, END_OF_WORD_CHAR]
    row += [PADDING_CHAR] * (MAX_CHARS_PER_TOKEN - len(row))
    return tuple([i + 1 for i in row])


BOS_CHAR_IDS = _row([BEGIN_OF_SENTENCE_CHAR])
EOS_CHAR_IDS = _row([END_OF_SENTENCE_CHAR])
_SPECIAL_ROWS = {BOS_TOKEN: BOS_CHAR_IDS, EOS_TOKEN: EOS_CHAR_IDS}


def add_boundaries(
    char_ids: torch.Tensor, bos_ids: Sequence[int], eos_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, time, W) ids -> (batch, time + 2, W) with the rows `bos_ids` at 0 and `eos_ids`
    right after each sentence's last token, and the (batch,) tokens per sentence without them."""
    batch, time, width = char_ids.shape
    lengths = (char_ids > 0).any(dim=-1).sum(dim=1)
    bounded = char_ids.new_zeros((batch, time + 2, width))
    bounded[:, 1 : time + 1] = char_ids
    device = char_ids.device
    bounded[:, 0] = torch.tensor(bos_ids, device=device)
    bounded[torch.arange(batch, device=device), lengths + 1] = torch.tensor(eos_ids, device=device)
    return bounded, lengths


def token_to_char_ids(token: str) -> tuple[int, ...]:
    """The 50 shifted character ids of one token (UTF-8 bytes truncated to 48)."""
    return tuple(_rows([token])[0].tolist())


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
    The rows of the whole batch are built at once from its tokens' UTF-8 bytes, and nothing is
    kept per word: faster than looking each word's row up in a cache was, and a process that
    keeps meeting new words does not keep replacing cached rows in its heap.
    """
    return place_rows(sentences, _rows, MAX_CHARS_PER_TOKEN)


def place_rows(
    sentences: Sequence[Sequence[str]], rows: Callable[[list[str]], Any], width: int
) -> torch.Tensor:
    """(batch, max_tokens, `width`) ids: the rows that `rows` gives the batch's tokens (all of
    them, in order), each at its sentence and position; rows of 0 past a sentence's end."""
    sentences = check_sentences(sentences)
    longest = max((len(s) for s in sentences), default=0)
    ids = numpy.zeros((len(sentences), longest, width), dtype=numpy.int64)
    tokens = [token for sentence in sentences for token in sentence]
    if tokens:
        lengths = [len(sentence) for sentence in sentences]
        sentence = numpy.repeat(numpy.arange(len(sentences)), lengths)  # of every token, in order
        position = numpy.concatenate([numpy.arange(n) for n in lengths])
        ids[sentence, position] = rows(tokens)
    return torch.from_numpy(ids)


def _rows(tokens: list[str]) -> numpy.ndarray:
    """(len(tokens), 50) int64: `token_to_char_ids` of each token."""
    encoded = [token.encode("utf-8", errors="ignore")[:MAX_BYTES_PER_TOKEN] for token in tokens]
    lengths = numpy.fromiter(map(len, encoded), dtype=numpy.int64, count=len(tokens))
    rows = numpy.full((len(tokens), MAX_CHARS_PER_TOKEN), PADDING_CHAR + 1, dtype=numpy.int64)
    rows[:, 0] = BEGIN_OF_WORD_CHAR + 1
    data = numpy.frombuffer(b"".join(encoded), dtype=numpy.uint8)
    token_of_byte = numpy.repeat(numpy.arange(len(tokens)), lengths)
    first_byte = numpy.cumsum(lengths) - lengths  # of each token, in `data`
    column = numpy.arange(len(data)) - numpy.repeat(first_byte, lengths) + 1
    rows[token_of_byte, column] = data.astype(numpy.int64) + 1
    rows[numpy.arange(len(tokens)), lengths + 1] = END_OF_WORD_CHAR + 1
    for index, token in enumerate(tokens):
        special = _SPECIAL_ROWS.get(token)
        if special is not None:
            rows[index] = special
    return rows


# ---------------------------------------------------------------------- batches
Item = TypeVar("Item")
BOUNDARY_TOKENS = 2  # <S> and </S> around every sentence


def batches_by_padded_tokens(
    items: Iterable[Item],
    batch_tokens: int,
    length: Callable[[Item], int] = len,
    max_items: Optional[int] = None,
) -> Iterator[list[Item]]:
    """Consecutive batches of `items` in their order, each padded within `batch_tokens`.

    An item starts a new batch when adding it would make the padded size
    (batch rows x (longest `length` + 2)) exceed `batch_tokens`, or the batch already holds
    `max_items`. An item longer than `batch_tokens` on its own gets a batch of its own.
    """
    batch: list[Item] = []
    width = 0  # longest length in the batch, boundaries included
    for item in items:
        item_width = length(item) + BOUNDARY_TOKENS
        joined_width = max(width, item_width)
        full = max_items is not None and len(batch) >= max_items
        if batch and (joined_width * (len(batch) + 1) > batch_tokens or full):
            yield batch
            batch, joined_width = [], item_width
        batch.append(item)
        width = joined_width
    if batch:
        yield batch
