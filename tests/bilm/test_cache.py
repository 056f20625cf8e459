"""bilm/cache.py's bounded LRU map against a reference: an OrderedDict whose totals are summed
anew after every operation, over random sequences of reads and writes."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from spacy_elmo.bilm.cache import BoundedCache, entry_bytes, key_bytes, one


class ReferenceLRU:
    """Least recently used first; nothing is counted incrementally."""

    def __init__(self, max_size, max_bytes, size):
        self.max_size, self.max_bytes, self.size_of = max_size, max_bytes, size
        self.entries = OrderedDict()

    def size(self):
        return sum(self.size_of(key) for key in self.entries)

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
        alone = ReferenceLRU(self.max_size, self.max_bytes, self.size_of)
        alone.entries[key] = value
        if not alone.within_bounds():
            return
        self.entries[key] = value
        while not self.within_bounds():
            self.entries.popitem(last=False)


def random_key(rng: random.Random) -> tuple[str, ...]:
    return tuple(rng.choice(["a", "bb", "ccc", "river", "bank"]) for _ in range(rng.randint(1, 4)))


@pytest.mark.parametrize(
    "max_size, max_bytes, size",
    [
        (10, None, len),
        (10, 300, len),
        (1000, 250, len),
        (4, None, one),
        (6, 200, one),
        (0, None, len),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_reads_and_writes_match_the_reference(max_size, max_bytes, size, seed):
    rng = random.Random(seed)
    cache = BoundedCache(max_size, max_bytes, size=size)
    reference = ReferenceLRU(max_size, max_bytes, size)
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
    assert "c" not in cache and list(cache.entries) == ["a", "d", "e"]


def test_an_entry_beyond_a_bound_is_not_stored_and_evicts_nothing():
    cache = BoundedCache(5, max_bytes=100, size=len)
    cache.put(("a", "b"), np.zeros(4, dtype="float32"))  # 16 + 2 bytes, size 2
    cache.put(tuple("abcdef"), np.zeros(1, dtype="float32"))  # size 6 > 5
    cache.put(("x",), np.zeros(100, dtype="float32"))  # 401 bytes > 100
    assert list(cache.entries) == [("a", "b")] and (cache.size, cache.nbytes) == (2, 18)


def test_empty_copy_keeps_the_bounds_and_sizes():
    cache = BoundedCache(7, max_bytes=1000, size=len)
    cache.put(("a", "b"), np.zeros(3))
    copy = cache.empty_copy()
    assert len(copy) == 0 and (copy.max_size, copy.max_bytes, copy.size_of) == (7, 1000, len)
    copy.put(("a", "b", "c"), np.zeros(3))
    assert copy.size == 3 and len(cache) == 1


def test_entry_bytes_of_arrays_tensors_and_keys():
    assert key_bytes("river") == 5 and key_bytes(b"\x01\x02\x03") == 3
    assert key_bytes(("river", "bank")) == 9 and key_bytes(()) == 0
    assert entry_bytes(("ab",), np.zeros((3, 2), dtype="float32")) == 24 + 2
    assert entry_bytes(b"12345", torch.zeros(7, dtype=torch.float32)) == 28 + 5
    assert entry_bytes(b"", torch.zeros(7, dtype=torch.float16)) == 14
    with pytest.raises(TypeError, match="got int"):
        key_bytes(3)


def test_bounds_must_not_be_negative():
    with pytest.raises(ValueError, match="max_size=-1"):
        BoundedCache(-1)
    with pytest.raises(ValueError, match="max_bytes=-5"):
        BoundedCache(3, max_bytes=-5)
    nothing = BoundedCache(0)
    nothing.put("a", np.zeros(1))
    assert len(nothing) == 0
