"""Train your own biLM: corpus streaming, vocabulary, training loop, checkpoints."""

from .trainer import PretrainConfig, pretrain

__all__ = ["PretrainConfig", "pretrain"]
