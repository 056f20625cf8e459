"""The biLM's token cache at inference (one of the fast paths; why: `fast_paths.py`).

Without autograd a `BiLM` looks the char-CNN vector of a token up here when it computed it
before with the same weights, keyed by the token's char ids: an LRU map of TOKEN_CACHE_SIZE
tokens and at most TOKEN_CACHE_BYTES (`RowCache`), emptied whenever a char-CNN weight changes.
Exact: a cached vector is the one the char CNN gave (tests/bilm/test_embed.py).

`RowCache` keeps the vectors as the rows of one tensor. Storing a row copies it into a free or
evicted row, so a process that keeps meeting new tokens allocates nothing per token once the
cache is full. (One small tensor per token, each replaced when evicted, scatters long-lived
allocations over the C heap between short-lived ones: in a service embedding new words all
day the heap's free gaps, and the resident set, kept growing after the cache was full.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import torch

from .cache import check_bounds

TOKEN_CACHE_SIZE = 20000  # distinct tokens whose char-CNN vectors are kept at inference
TOKEN_CACHE_BYTES = 64 * 2**20  # and at most this many bytes of them (keys and vectors)


class TokenCache:
    """Char-CNN vectors of the tokens seen last, shared by the threads that run one biLM (it
    is read and updated under a lock; the char CNN of the tokens it lacks runs outside it).
    Copied or pickled, it is a new, empty cache of the same size."""

    def __init__(self, max_size: int = TOKEN_CACHE_SIZE) -> None:
        self.max_size = max_size
        self.lock = threading.Lock()  # `BiLM.embed` may run from several threads
        self.rows = RowCache(max_size, TOKEN_CACHE_BYTES)  # the vectors, by 50 char ids
        self.weights: tuple = ()  # the key of the weights the rows were computed with

    def __len__(self) -> int:
        return len(self.rows)

    def clear(self) -> None:
        """Forget every vector (the weights changed where no version counter saw it)."""
        with self.lock:
            self.rows.clear()
            self.weights = ()

    def char_cnn(
        self,
        char_cnn: Callable[[torch.Tensor], torch.Tensor],
        parameters: Iterable[torch.Tensor],
        distinct: torch.Tensor,
        version: tuple,
    ) -> torch.Tensor:
        """char_cnn(distinct) (k, P) for k distinct rows of char ids (k, 50), the tokens seen
        before read from the cache. The cache is emptied first where the weights changed: one
        of the char CNN's `parameters` replaced or written in place, or `version` (what the
        biLM counts besides: `BiLM.weights_generation`, its `quantize`) is another."""
        weights = (version, _weights_key(parameters))
        keys = [row.tobytes() for row in distinct.cpu().numpy()]
        with self.lock:
            if weights != self.weights:
                self.rows.clear()
                self.weights = weights
            found, cached = self.rows.get(keys)  # a copy of the rows: others may overwrite them
        if len(found) == len(keys):
            return cached
        known = set(found)
        missing = [i for i in range(len(keys)) if i not in known]
        computed = char_cnn(distinct[torch.tensor(missing, device=distinct.device)])
        with self.lock:
            if weights == self.weights:
                self.rows.put([keys[i] for i in missing], computed)  # copied into its rows
        if not found:
            return computed
        vectors = computed.new_empty((len(keys), *computed.shape[1:]))
        vectors[torch.tensor(found, device=vectors.device)] = cached
        vectors[torch.tensor(missing, device=vectors.device)] = computed
        return vectors

    def __getstate__(self) -> dict:
        """For copy and pickle: the size only (a lock cannot be copied)."""
        return {"max_size": self.max_size}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_size"])


def _weights_key(weights: Iterable[torch.Tensor]) -> tuple:
    """Changes whenever one of the tensors is replaced or modified in place."""
    return tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)


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
        check_bounds(max_size, max_bytes)
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
