"""bilm/cache.py's bounded LRU maps against a reference: an OrderedDict whose totals are summed
anew after every operation, over random sequences of reads and writes; and the row cache's
one tensor, which storing and evicting rows never replaces."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from spacy_elmo.bilm.cache import BoundedCache, entry_bytes
from spacy_elmo.bilm.tokens import RowCache


class ReferenceLRU:
    """Least recently used first; nothing is counted incrementally."""

    def __init__(self, max_size, max_bytes):
        self.max_size, self.max_bytes = max_size, max_bytes
        self.entries = OrderedDict()

    def size(self):
        return sum(len(key) for key in self.entries)

    def nbytes(self):
        return sum(
            value.nbytes + sum(len(word) for word in key) for key, value in self.entries.items()
        )

    def within_bounds(self):
        return self.size() <= self.max_size and (
            self.max_bytes is None or self.nbytes() <= self.max_bytes
        )

    def get(self, key):
        if key not in self.entries:
            return None
        self.entries.move_to_end(key)
        return self.entries[key]

    def put(self, key, value):
        if key in self.entries:
            return
        alone = ReferenceLRU(self.max_size, self.max_bytes)
        alone.entries[key] = value
        if not alone.within_bounds():
            return
        self.entries[key] = value
        while not self.within_bounds():
            self.entries.popitem(last=False)


def random_key(rng: random.Random) -> tuple[str, ...]:
    return tuple(rng.choice(["a", "bb", "ccc", "river", "bank"]) for _ in range(rng.randint(1, 4)))


@pytest.mark.parametrize(
    "max_size, max_bytes", [(10, None), (10, 300), (1000, 250), (4, None), (6, 200), (0, None)]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_reads_and_writes_match_the_reference(max_size, max_bytes, seed):
    rng = random.Random(seed)
    cache = BoundedCache(max_size, max_bytes)
    reference = ReferenceLRU(max_size, max_bytes)
    for step in range(400):
        key = random_key(rng)
        if rng.random() < 0.4:
            got, want = cache.get(key), reference.get(key)
            assert (got is None and want is None) or got is want, step
        else:
            value = np.zeros((2, len(key), rng.choice([1, 4, 8])), dtype="float32")
            cache.put(key, value)
            reference.put(key, value)
        # the same entries in the same order of use, and the running totals are the sums
        assert list(cache.entries) == list(reference.entries), step
        assert cache.size == reference.size() and cache.nbytes == reference.nbytes(), step
        assert len(cache) == len(reference.entries)
        assert cache.size <= max_size and (max_bytes is None or cache.nbytes <= max_bytes)
        if step % 97 == 96:
            cache.clear()
            reference.entries.clear()
            assert cache.size == cache.nbytes == len(cache) == 0


def test_eviction_order_is_least_recently_used():
    cache = BoundedCache(3)
    for key in "abc":
        cache.put(key, np.zeros(1))
    assert cache.get("a") is not None  # a is now the most recently used; b the least
    assert cache.get("z") is None  # a miss changes nothing
    cache.put("d", np.zeros(1))
    assert list(cache.entries) == ["c", "a", "d"]
    cache.put("c", np.ones(1))  # a key that is there is not replaced and not refreshed
    assert list(cache.entries) == ["c", "a", "d"] and cache.entries["c"][0] == 0
    cache.put("e", np.zeros(1))
    assert list(cache.entries) == ["a", "d", "e"]


def test_an_entry_beyond_a_bound_is_not_stored_and_evicts_nothing():
    cache = BoundedCache(5, max_bytes=100)
    cache.put(("a", "b"), np.zeros(4, dtype="float32"))  # 16 + 2 bytes, size 2
    cache.put(tuple("abcdef"), np.zeros(1, dtype="float32"))  # size 6 > 5
    cache.put(("x",), np.zeros(100, dtype="float32"))  # 401 bytes > 100
    assert list(cache.entries) == [("a", "b")] and (cache.size, cache.nbytes) == (2, 18)


def test_empty_copy_keeps_the_bounds():
    cache = BoundedCache(7, max_bytes=1000)
    cache.put(("a", "b"), np.zeros(3))
    copy = cache.empty_copy()
    assert len(copy) == 0 and (copy.max_size, copy.max_bytes) == (7, 1000)
    copy.put(("a", "b", "c"), np.zeros(3))
    assert copy.size == 3 and len(cache) == 1


def test_entry_bytes_of_arrays_tensors_and_keys():
    nothing = np.zeros(0)
    assert entry_bytes(("river",), nothing) == 5 and entry_bytes(("a", "b", "c"), nothing) == 3
    assert entry_bytes(("river", "bank"), nothing) == 9 and entry_bytes((), nothing) == 0
    assert entry_bytes(("ab",), np.zeros((3, 2), dtype="float32")) == 24 + 2
    assert entry_bytes(("12345",), torch.zeros(7, dtype=torch.float32)) == 28 + 5
    assert entry_bytes((), torch.zeros(7, dtype=torch.float16)) == 14


def test_bounds_must_not_be_negative():
    with pytest.raises(ValueError, match="max_size=-1"):
        BoundedCache(-1)
    with pytest.raises(ValueError, match="max_bytes=-5"):
        BoundedCache(3, max_bytes=-5)
    nothing = BoundedCache(0)
    nothing.put("a", np.zeros(1))
    assert len(nothing) == 0


# ---------------------------------------------------------------------- RowCache
def row_key(i: int) -> bytes:
    return i.to_bytes(4, "little")  # keys of one length, as the biLM's char ids are


@pytest.mark.parametrize("max_size, max_bytes", [(6, 1 << 20), (50, 10 * (4 + 12)), (0, 1 << 20)])
@pytest.mark.parametrize("seed", [0, 1])
def test_row_cache_matches_an_lru_reference(max_size, max_bytes, seed):
    rng = random.Random(seed)
    cache = RowCache(max_size, max_bytes)
    capacity = min(max_size, max_bytes // (4 + 12))
    reference: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # least recently used first
    for step in range(300):
        keys = [row_key(rng.randrange(15)) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.5:
            found, rows = cache.get(keys)
            want = [i for i, key in enumerate(keys) if key in reference]
            assert found == want, step
            for i, row in zip(found, [] if rows is None else rows):
                torch.testing.assert_close(row, reference[keys[i]], rtol=0, atol=0)
                reference.move_to_end(keys[i])
        else:
            vectors = torch.randn(len(keys), 3)
            cache.put(keys, vectors)
            for key, vector in zip(keys, vectors):
                if capacity and key not in reference:
                    reference[key] = vector.clone()
                    if len(reference) > capacity:
                        reference.popitem(last=False)
        assert list(cache.slots) == list(reference), step
        assert cache.capacity in (0, capacity) and len(cache) <= capacity
        assert cache.nbytes <= max_bytes


def test_row_cache_rows_stay_one_tensor_and_reads_are_copies():
    cache = RowCache(4, 1 << 20)
    cache.put([row_key(i) for i in range(3)], torch.arange(6.0).reshape(3, 2))
    rows = cache.rows
    address = rows.data_ptr()
    for start in range(3, 40, 3):  # a stream of new keys, each evicting the oldest
        keys = [row_key(i) for i in range(start, start + 3)]
        cache.put(keys, torch.full((3, 2), float(start)))
        assert cache.rows is rows and rows.data_ptr() == address and len(cache) == 4
    found, copy = cache.get([row_key(39), row_key(0)])
    assert found == [0] and copy.tolist() == [[39.0, 39.0]]
    copy += 1  # a copy: the cache's row is unchanged
    assert cache.get([row_key(39)])[1].tolist() == [[39.0, 39.0]]
    cache.clear()  # the keys go, the tensor stays for the next rows
    assert len(cache) == 0 and cache.get([row_key(39)]) == ([], None) and cache.rows is rows
    cache.put([row_key(1)], torch.ones(1, 2, dtype=torch.float64))  # another dtype: new rows
    assert cache.rows.dtype == torch.float64 and cache.rows.shape == (4, 2)
    assert cache.get([row_key(1)])[1].tolist() == [[1.0, 1.0]]


def test_row_cache_bounds():
    with pytest.raises(ValueError, match="max_size=-1"):
        RowCache(-1, 1 << 20)
    nothing = RowCache(5, max_bytes=8)  # not even one row of 8 bytes and its key fits
    nothing.put([b"ab"], torch.zeros(1, 2))
    assert len(nothing) == 0 and nothing.capacity == 0 and nothing.get([b"ab"]) == ([], None)


def test_row_cache_takes_rows_in_and_out_of_inference_mode():
    cache = RowCache(3, 1 << 20)
    with torch.inference_mode():  # `BiLM.embed`
        cache.put([b"ab"], torch.ones(1, 2))
    with torch.no_grad():  # the elmo component's prediction, through Thinc
        cache.put([b"cd"], torch.full((1, 2), 2.0))
    cache.put([b"ef"], torch.full((1, 2), 3.0, requires_grad=True))
    found, rows = cache.get([b"ab", b"cd", b"ef"])
    assert found == [0, 1, 2] and rows.tolist() == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert not rows.requires_grad
