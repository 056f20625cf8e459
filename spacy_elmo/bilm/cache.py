"""Least-recently-used maps bounded in size and in bytes.

`BoundedCache` keeps one value object per key: the frozen layers of the `elmo` component's
training units (`layers/layer_cache.py`; the size of an entry is its number of tokens). An
entry's bytes are its value's (`.nbytes`: numpy, cupy and torch arrays) plus its key's: the
characters of a string, the length of a bytes key, the sum over a tuple's items; a long key is
not kept alive for free.

`RowCache` keeps equal-width vectors as the rows of one tensor: the biLM's char-CNN vectors of
the tokens it saw last (`token_cache.py`). Storing a row copies it into a free or evicted row of
that tensor, so a process that keeps meeting new tokens allocates nothing per token once the
cache is full. (One small tensor per token, each replaced when evicted, scatters long-lived
allocations over the C heap between short-lived ones: in a service embedding new words all
day the heap's free gaps, and the resident set, kept growing after the cache was full.)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, List, Optional, Sequence, Tuple, TypeVar

import torch

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


def _check_bounds(max_size: int, max_bytes: Optional[int]) -> None:
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
        _check_bounds(max_size, max_bytes)
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


class RowCache:
    """LRU map of bytes keys (all of one length) to vectors of one shape, dtype and device,
    stored as the rows of one (capacity, ...) tensor.

    The capacity is `max_size` rows, lowered, when `max_bytes` is set, until the tensor and as
    many keys fit in `max_bytes`. The tensor is allocated at its full capacity when the first
    rows are stored (its pages are only touched as rows are written) and reused after `clear`;
    rows of another shape, dtype or device, or keys of another length, replace it. Reads
    return copies, so a row may be overwritten as soon as the caller lets go of the lock. Not
    thread-safe: callers that share a cache between threads lock around it.
    """

    def __init__(self, max_size: int, max_bytes: Optional[int] = None) -> None:
        _check_bounds(max_size, max_bytes)
        self.max_size = max_size
        self.max_bytes = max_bytes
        self.rows: Optional[torch.Tensor] = None  # (capacity, ...) once rows were stored
        self.key_length = 0  # the length of every key the rows were sized for
        self.slots: OrderedDict[bytes, int] = OrderedDict()  # key -> its row, LRU first

    @property
    def capacity(self) -> int:
        """How many rows fit (0 before the first rows are stored)."""
        return 0 if self.rows is None else self.rows.shape[0]

    @property
    def nbytes(self) -> int:
        """The rows' tensor, used or not, and the keys stored."""
        rows = 0 if self.rows is None else self.rows.numel() * self.rows.element_size()
        return rows + len(self.slots) * self.key_length

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, key: bytes) -> bool:
        return key in self.slots

    def get(self, keys: Sequence[bytes]) -> Tuple[List[int], Optional[torch.Tensor]]:
        """The positions in `keys` of those stored (now the most recently used), in order, and
        a copy of their rows, (n_found, ...); ([], None) when none is stored."""
        found, slots = [], []
        for i, key in enumerate(keys):
            slot = self.slots.get(key)
            if slot is not None:
                self.slots.move_to_end(key)
                found.append(i)
                slots.append(slot)
        if not found:
            return [], None
        assert self.rows is not None
        return found, self.rows[torch.tensor(slots, device=self.rows.device)]

    def put(self, keys: Sequence[bytes], vectors: torch.Tensor) -> None:
        """Store vectors[i] under keys[i]; a key that is there keeps its row and is not
        refreshed. Each new key takes a free row, or the least recently used key's."""
        if not keys:
            return
        if len(keys) != vectors.shape[0]:
            raise ValueError(f"{len(keys)} keys for {vectors.shape[0]} rows")
        key_length = len(keys[0])
        if any(len(key) != key_length for key in keys):
            raise ValueError("the keys of a RowCache all have one length")
        rows = self.rows
        if (
            rows is None
            or rows.shape[1:] != vectors.shape[1:]
            or rows.dtype != vectors.dtype
            or rows.device != vectors.device
            or key_length != self.key_length
        ):
            rows = self._allocate(vectors, key_length)
        if rows.shape[0] == 0:
            return
        targets = {}  # row -> the index of the vector it gets (the last one wins)
        for i, key in enumerate(keys):
            if key in self.slots:
                continue
            if len(self.slots) < rows.shape[0]:  # rows 0 .. len - 1 are in use
                slot = len(self.slots)
            else:
                _, slot = self.slots.popitem(last=False)
            self.slots[key] = slot
            targets[slot] = i
        if targets:
            device = rows.device
            rows[torch.tensor(list(targets), device=device)] = vectors[
                torch.tensor(list(targets.values()), device=device)
            ].detach()

    def _allocate(self, like: torch.Tensor, key_length: int) -> torch.Tensor:
        """An empty cache with an (uninitialised) rows tensor for rows like `like`'s."""
        self.clear()
        row_bytes = like[0].numel() * like.element_size() if like.shape[0] else 0
        capacity = self.max_size
        if self.max_bytes is not None:
            capacity = min(capacity, self.max_bytes // max(1, row_bytes + key_length))
        # A normal tensor even when allocated in inference mode, so that rows can be stored
        # from outside it too (under `torch.no_grad()`)
        with torch.inference_mode(False):
            self.rows = torch.empty(
                (capacity, *like.shape[1:]), dtype=like.dtype, device=like.device
            )
        self.key_length = key_length
        return self.rows

    def clear(self) -> None:
        """Forget every key; the rows' tensor is kept for the next rows."""
        self.slots.clear()
