"""A least-recently-used map bounded in size and in bytes.

`BoundedCache` keeps one value object per key: the frozen layers of the `elmo` component's
training units (`layers/elmo_model.py`; the size of an entry is its number of tokens). An
entry's bytes are its value's (`.nbytes`: numpy, cupy and torch arrays) plus its key's: the
characters of a string, the length of a bytes key, the sum over a tuple's items; a long key is
not kept alive for free. (The biLM's token cache, rows of one tensor, is `tokens.TokenCache`.)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Optional, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def one(key: Any) -> int:
    """The size of every entry in a cache bounded by its number of entries."""
    return 1


def key_bytes(key: Any) -> int:
    """The characters of a string, the bytes of a bytes key, the sum over a tuple's items."""
    if isinstance(key, (str, bytes)):
        return len(key)
    if isinstance(key, tuple):
        return sum(key_bytes(part) for part in key)
    raise TypeError(f"a cache key is a str, bytes or a tuple of them, got {type(key).__name__}")


def entry_bytes(key: Any, value: Any) -> int:
    """The memory an entry keeps alive: its value's bytes and its key's."""
    return int(value.nbytes) + key_bytes(key)


def check_bounds(max_size: int, max_bytes: Optional[int]) -> None:
    """ValueError unless a cache's bounds are non-negative."""
    if max_size < 0 or (max_bytes is not None and max_bytes < 0):
        raise ValueError(
            f"a cache's bounds must be non-negative, got max_size={max_size}, max_bytes={max_bytes}"
        )


class BoundedCache(Generic[K, V]):
    """LRU map holding entries of total size at most `max_size` and, when `max_bytes` is set,
    of at most that many bytes (`entry_bytes`). `size(key)` is an entry's size (default 1).

    An entry that alone exceeds a bound is not stored; storing one evicts the least recently
    used entries (read or stored) until both bounds hold. Not thread-safe: callers that share
    a cache between threads lock around it.
    """

    def __init__(
        self,
        max_size: int,
        max_bytes: Optional[int] = None,
        *,
        size: Callable[[K], int] = one,
    ) -> None:
        check_bounds(max_size, max_bytes)
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.size_of = size
        self.size = 0  # the entries' total size
        self.nbytes = 0  # and their total bytes
        self.entries: OrderedDict[K, V] = OrderedDict()  # least recently used first

    def empty_copy(self) -> BoundedCache[K, V]:
        """A new, empty cache with the same bounds and sizes."""
        return BoundedCache(self.max_size, self.max_bytes, size=self.size_of)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: K) -> bool:
        return key in self.entries

    def get(self, key: K) -> Optional[V]:
        """The value stored under `key` (now the most recently used), or None."""
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Store `value` under `key` unless the key is there or the entry alone is too big."""
        if key in self.entries:
            return
        size, nbytes = self.size_of(key), entry_bytes(key, value)
        if size > self.max_size or (self.max_bytes is not None and nbytes > self.max_bytes):
            return
        self.entries[key] = value
        self.size += size
        self.nbytes += nbytes
        while self.size > self.max_size or (
            self.max_bytes is not None and self.nbytes > self.max_bytes
        ):
            old_key, old_value = self.entries.popitem(last=False)
            self.size -= self.size_of(old_key)
            self.nbytes -= entry_bytes(old_key, old_value)

    def clear(self) -> None:
        self.entries.clear()
        self.size = 0
        self.nbytes = 0
