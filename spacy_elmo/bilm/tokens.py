"""The token layer at speed (docs/MODEL.md §5; held against `reference.CharCNN`): the char CNN
once per distinct token of a batch, on the columns that decide the max (after a token's end
every window of padding gives one value: bit for bit the same max, on about half the columns),
as channels-last 2-d convolutions on the CPU at inference (oneDNN writes their output in place),
and at inference the vectors of the tokens seen last read from the token cache (`TokenCache`,
rows of one tensor: nothing allocated per token once it is full).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import partial
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .cache import check_bounds

# The convolution outputs (n, filters, positions) are the largest tensors of the biLM: the
# convolutions run on blocks of tokens so that one filter bank's output stays under
# CNN_BLOCK_BYTES; the highway and projection GEMMs on blocks of at least TOP_BLOCK_ROWS tokens,
# where they run at full speed.
CNN_BLOCK_BYTES = 8 << 20  # 40 tokens for the published models' 1024-filter bank
TOP_BLOCK_ROWS = 256


def token_vectors(
    cnn: nn.Module,
    char_ids: torch.Tensor,
    padding_id: int,
    training: bool,
    cache: TokenCache,
    version: tuple,
) -> torch.Tensor:
    """(..., P) vectors of (..., W) char ids, zero where no token is: the char CNN (`cnn`, a
    `reference.CharCNN`) once per distinct token, those in `cache` (at inference, computed
    with the same weights: `version` and the parameters' own) read from it."""
    mask = (char_ids > 0).any(dim=-1)
    output = char_ids.new_zeros(
        (*char_ids.shape[:-1], cnn.projection_dim), dtype=cnn.char_embedding.weight.dtype
    )
    if mask.any():
        distinct, inverse = distinct_rows(char_ids[mask])  # (k, W), (n,)
        run = partial(char_cnn, cnn, padding_id=padding_id, training=training)
        if not training and cache.max_size > 0:
            vectors = cache.char_cnn(run, cnn.parameters(), distinct, version)
        else:
            vectors = run(distinct)  # (k, P)
        output[mask] = vectors[inverse]
    return output


def char_cnn(
    cnn: nn.Module, char_ids: torch.Tensor, padding_id: int, training: bool
) -> torch.Tensor:
    """`reference.CharCNN`'s (n, P) vectors of (n, W) ids, on the columns that decide the max
    (`trim_columns`), in blocks."""
    words = None
    if cnn.word_embedding is not None:  # rows are 50 char ids and a word id
        words = cnn.word_embedding(char_ids[:, -1])  # (n, word_dim)
        char_ids = char_ids[:, :-1]
    widest = max(conv.kernel_size[0] for conv in cnn.convolutions)
    char_ids = trim_columns(char_ids, padding_id, widest)
    max_filters = max(conv.out_channels for conv in cnn.convolutions)
    conv_rows = max(1, CNN_BLOCK_BYTES // (max_filters * char_ids.shape[-1] * 4))
    channels_last = char_ids.device.type == "cpu" and not training
    outputs = []
    start = 0
    for block in char_ids.split(max(conv_rows, TOP_BLOCK_ROWS)):
        features = torch.cat(
            [_features(cnn, part, channels_last) for part in block.split(conv_rows)]
        )
        for highway in cnn.highways:  # reference.Highway, written out to stay in this file
            transform, carry = F.linear(features, highway.weight, highway.bias).chunk(2, dim=-1)
            gate = torch.sigmoid(carry)
            features = gate * torch.relu(transform) + (1 - gate) * features
        if words is not None:  # (n, word_dim + F), the word vector first
            features = torch.cat([words[start : start + len(block)], features], dim=-1)
        start += len(block)
        outputs.append(cnn.projection(features))  # (n, P)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _features(cnn: nn.Module, char_ids: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """(n, columns) character ids -> (n, F) max-pooled filter activations (max, then the
    activation: bilm-tf's order)."""
    chars = cnn.char_embedding(char_ids)  # (n, columns, e)
    features = []
    for conv in cnn.convolutions:
        if channels_last:  # a 2-d convolution of height 1, channels last
            x = chars.transpose(1, 2)[:, :, None, :].contiguous(memory_format=torch.channels_last)
            scores = F.conv2d(x, conv.weight[:, :, None, :], conv.bias)  # (n, filters, 1, cols)
            features.append(cnn.activation(scores.amax(dim=(2, 3))))
        else:
            features.append(cnn.activation(conv(chars.transpose(1, 2)).amax(dim=-1)))
    return torch.cat(features, dim=-1)


def trim_columns(char_ids: torch.Tensor, padding_id: int, widest_filter: int) -> torch.Tensor:
    """The first columns of (n, 50) char ids that decide the max-pooled features: those up to
    the longest token's end, plus the widest filter's (one all-padding window)."""
    # The char CNN's training 2.4x faster: 226 to 95 ms per 2,048 tokens (docs/research/speed.md)
    padding = char_ids == padding_id
    longest = int((~padding).sum(dim=-1).max()) if char_ids.shape[0] else 0
    keep = longest + widest_filter
    return char_ids[:, :keep] if keep < char_ids.shape[-1] else char_ids


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of (n, W) char ids and each row's index among them, as
    `torch.unique(rows, dim=0, return_inverse=True)` gives them (up to their order)."""
    if rows.device.type != "cpu":
        return torch.unique(rows, dim=0, return_inverse=True)
    # On the CPU NumPy's unique over each row's bytes: 4x `unique_dim` (docs/research/engine.md)
    values = np.ascontiguousarray(rows.numpy())
    keys = values.view(np.dtype((np.void, values.dtype.itemsize * values.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return rows[torch.from_numpy(first)], torch.from_numpy(inverse.reshape(-1))


# ---------------------------------------------------------------------- the token cache
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
    """Changes whenever one of the tensors is replaced or modified in place. `_version`, torch's
    count of in-place writes (private), is the one sign of an optimiser step or an edit under
    `torch.no_grad()`; without it such a write would leave stale vectors in the cache."""
    return tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)


class RowCache:
    """LRU map of bytes keys (all of one length) to vectors of one shape, dtype and device,
    stored as the rows of one (capacity, ...) tensor: `max_size` rows, fewer where the tensor
    and its keys would not fit in `max_bytes`. The tensor is allocated whole when the first
    rows are stored and kept after `clear`; rows of another kind, or keys of another length,
    replace it. Reads return copies. Not thread-safe: callers that share one lock around it.
    """

    def __init__(self, max_size: int, max_bytes: int) -> None:
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
        key_length = len(keys[0])
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
        row_bytes = like[0].numel() * like.element_size()
        capacity = min(self.max_size, self.max_bytes // (row_bytes + key_length))
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
