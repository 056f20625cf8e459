"""spacy-elmo: ELMo contextual word vectors for spaCy."""

from .bilm import BiLM, BiLMOptions, batch_to_ids

__version__ = "0.1.0"

__all__ = ["BiLM", "BiLMOptions", "batch_to_ids", "__version__"]
