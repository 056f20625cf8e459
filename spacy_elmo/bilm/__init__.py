"""Pure-PyTorch ELMo biLM (no spaCy or Thinc imports in this package)."""

from .chars import batch_to_ids, token_to_char_ids
from .model import BiLM, BiLMActivations, BiLMOutput
from .options import BiLMOptions

__all__ = [
    "BiLM",
    "BiLMActivations",
    "BiLMOptions",
    "BiLMOutput",
    "batch_to_ids",
    "token_to_char_ids",
]
