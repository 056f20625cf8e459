"""A least-recently-used map bounded in size and in bytes: the frozen layers of the `elmo`
component's training units (`layers/elmo_model.py`). The biLM's token cache, rows of one
tensor, is `tokens.TokenCache`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

Words = tuple[str, ...]  # a training unit's words: an entry's key


def entry_bytes(key: Words, value: Any) -> int:
    """The memory an entry keeps alive: its value's bytes (`.nbytes`: numpy, cupy and torch
    arrays) and its key's, a unit's words: their characters."""
    return int(value.nbytes) + sum(map(len, key))


def check_bounds(max_size: int, max_bytes: Optional[int]) -> None:
    """ValueError unless a cache's bounds are non-negative."""
    if max_size < 0 or (max_bytes is not None and max_bytes < 0):
        raise ValueError(
            f"a cache's bounds must be non-negative, got max_size={max_size}, max_bytes={max_bytes}"
        )


class BoundedCache:
    """LRU map holding entries of at most `max_size` words in all (an entry's size is its key's
    length) and, when `max_bytes` is set, of at most that many bytes (`entry_bytes`).

    An entry that alone exceeds a bound is not stored; storing one evicts the least recently
    used entries (read or stored) until both bounds hold. Not thread-safe: callers that share
    a cache between threads lock around it.
    """

    def __init__(self, max_size: int, max_bytes: Optional[int] = None) -> None:
        check_bounds(max_size, max_bytes)
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.size = 0  # the words of all entries
        self.nbytes = 0  # and their total bytes
        self.entries: OrderedDict[Words, Any] = OrderedDict()  # least recently used first

    def empty_copy(self) -> BoundedCache:
        """A new, empty cache with the same bounds."""
        return BoundedCache(self.max_size, self.max_bytes)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: Words) -> Any:
        """The value stored under `key` (now the most recently used), or None."""
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def put(self, key: Words, value: Any) -> None:
        """Store `value` under `key` unless the key is there or the entry alone is too big."""
        if key in self.entries:
            return
        size, nbytes = len(key), entry_bytes(key, value)
        if not self._within(size, nbytes):
            return
        self.entries[key] = value
        self.size += size
        self.nbytes += nbytes
        while not self._within(self.size, self.nbytes):
            old_key, old_value = self.entries.popitem(last=False)
            self.size -= len(old_key)
            self.nbytes -= entry_bytes(old_key, old_value)

    def _within(self, size: int, nbytes: int) -> bool:
        """Whether entries of this total size and bytes fit in both bounds."""
        return size <= self.max_size and (self.max_bytes is None or nbytes <= self.max_bytes)

    def clear(self) -> None:
        self.entries.clear()
        self.size = 0
        self.nbytes = 0
