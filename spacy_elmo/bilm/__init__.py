"""Pure-PyTorch ELMo biLM (no spaCy or Thinc imports in this package)."""

from ..description.chars import batch_to_ids
from ..description.options import BiLMOptions
from .model import BiLM, BiLMActivations, BiLMOutput

__all__ = ["BiLM", "BiLMActivations", "BiLMOptions", "BiLMOutput", "batch_to_ids"]
