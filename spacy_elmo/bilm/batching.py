"""Batches of sentences by padded size: rows x (longest sentence + <S> and </S>)."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, TypeVar

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
