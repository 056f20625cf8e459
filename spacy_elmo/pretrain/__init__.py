"""Train your own biLM: corpus streaming, vocabulary, training loop, checkpoints."""

from .config import PretrainConfig
from .trainer import pretrain

__all__ = ["PretrainConfig", "pretrain"]
