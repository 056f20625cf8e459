"""spacy-elmo: ELMo contextual word vectors for spaCy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["BiLM", "BiLMOptions", "batch_to_ids", "__version__"]

if TYPE_CHECKING:
    from .bilm import BiLM, BiLMOptions, batch_to_ids


def __getattr__(name: str) -> Any:
    """The biLM's names, imported when first asked for: `spacy-elmo` sets its signal handlers
    before torch is imported (seconds), and `import spacy_elmo.util` needs no torch."""
    if name in ("BiLM", "BiLMOptions", "batch_to_ids"):
        from . import bilm

        return getattr(bilm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
