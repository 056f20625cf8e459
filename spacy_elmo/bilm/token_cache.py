"""The biLM's token cache at inference (one of the fast paths; why: `fast_paths.py`).

Without autograd a `BiLM` looks the char-CNN vector of a token up here when it computed it
before with the same weights, keyed by the token's char ids: an LRU map of TOKEN_CACHE_SIZE
tokens and at most TOKEN_CACHE_BYTES (`cache.RowCache`), emptied whenever a char-CNN weight
changes. Exact: a cached vector is the one the char CNN gave (tests/bilm/test_embed.py).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

import torch

from .cache import RowCache

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
