"""The frozen-layer training cache bounded in megabytes (`cache_mb`), next to `cache_tokens`."""

from __future__ import annotations

import numpy as np
from spacy.tokens import Doc

from spacy_elmo.pipeline.architectures import ElmoModel

from .pipeline_util import TINY_WIDTH, tiny_nlp


def layer_cache(max_tokens: int, max_bytes: int | None = None):
    """The training cache of an ElmoModel.v1 with these bounds."""
    cache_mb = None if max_bytes is None else max_bytes / 2**20
    return ElmoModel(cache_tokens=max_tokens, cache_mb=cache_mb).attrs["cache"]


def layers(n_tokens: int) -> np.ndarray:
    return np.zeros((3, n_tokens, 4), dtype="float32")  # 48 bytes per token


def test_cache_evicts_the_least_recently_used_beyond_its_bytes():
    cache = layer_cache(max_tokens=1000, max_bytes=48 * 10)
    cache.put(("a",) * 4, layers(4))
    cache.put(("b",) * 4, layers(4))
    assert cache.get(("a",) * 4) is not None  # "a" is now the most recent
    cache.put(("c",) * 4, layers(4))  # 12 tokens = 576 bytes > 480: "b" goes
    assert sorted(k[0] for k in cache.entries) == ["a", "c"]
    assert cache.nbytes == 8 * 48 + 8 and cache.size == 8  # layers + key characters
    cache.put(("d",) * 11, layers(11))  # larger than the whole bound: not kept
    assert ("d",) * 11 not in cache.entries
    cache.clear()
    assert cache.nbytes == cache.size == 0
    assert cache.empty_copy().max_bytes == 48 * 10


def test_the_token_bound_alone_counts_the_tokens_of_each_unit():
    cache = layer_cache(max_tokens=8)
    for key in "abc":
        cache.put((key,) * 4, layers(4))
    assert sorted(k[0] for k in cache.entries) == ["b", "c"] and cache.size == 8


def test_cache_mb_bounds_the_training_cache_of_the_component(bilm_dir):
    words = [[f"w{i}", "x", "y", "z"] for i in range(20)]  # 20 units of 4 tokens
    unit_bytes = 3 * 4 * TINY_WIDTH * 4  # (L + 1, tokens, 2P) float32
    mb = 5.5 * unit_bytes / 2**20  # room for 5 units
    for model_config, expected_units in (({"cache_mb": mb}, 5), ({"cache_tokens": 12}, 3)):
        nlp = tiny_nlp(bilm_dir, model=model_config)
        nlp.initialize()
        model = nlp.get_pipe("elmo").model
        docs = [Doc(nlp.vocab, words=w) for w in words]
        model.begin_update(docs)
        cache = model.attrs["cache"]
        assert len(cache.entries) == expected_units, model_config
        key_chars = sum(len(word) for key in cache.entries for word in key)
        assert cache.nbytes == expected_units * unit_bytes + key_chars
    assert nlp.config["components"]["elmo"]["model"]["cache_mb"] is None  # the default


def test_the_byte_bound_counts_the_keys_too():
    import numpy

    cache = layer_cache(max_tokens=100, max_bytes=10_000)
    small = numpy.zeros((3, 1, 4), dtype="float32")  # 48 bytes
    cache.put(("x" * 20_000,), small)  # a 20,000-character token alone exceeds the bound
    assert not cache.entries and cache.nbytes == 0
    cache.put(("a",), small)
    cache.put(("b" * 9_000,), small)
    assert cache.nbytes == 2 * 48 + 1 + 9_000
    cache.put(("c" * 2_000,), small)  # over the bound: the oldest entries go
    assert ("a",) not in cache.entries and cache.nbytes <= 10_000
