"""The cache of frozen biLM layers: a training unit's words -> its (L + 1, n, 2P) layers.

With a frozen biLM (the default, as in the paper) a unit's layers depend only on its words, and
training docs come back every epoch: keeping their layers spares later epochs the biLM. The
cache is bounded by the tokens it holds (`cache_tokens`) and, with `cache_mb`, by the bytes
of the layers and keys it holds; the least recently used units go first. Inference does not
use it: there a cache would double the memory of a long document.
"""

from typing import Optional, Tuple

from thinc.types import Floats3d

from ..bilm.cache import BoundedCache

LayerCache = BoundedCache[Tuple[str, ...], Floats3d]


def layer_cache(max_tokens: int, max_bytes: Optional[int] = None) -> LayerCache:
    """An empty cache of unit layers holding at most `max_tokens` tokens (and `max_bytes`)."""
    return BoundedCache(max_tokens, max_bytes, size=len)
