"""`BiLM.embed`: pre-tokenised sentences in, one float32 array of layers per sentence out."""

from __future__ import annotations

from typing import Sequence

import numpy
import torch
from torch import nn

from ..description.chars import check_sentences


def embed_sentences(
    bilm: nn.Module, sentences: Sequence[Sequence[str]], batch_size: int = 64
) -> list[numpy.ndarray]:
    """One float32 array (L + 1, n_i, 2P) per sentence from `bilm` (a `model.BiLM`), in input
    order, `batch_size` sentences a batch: longest first in the default mode; in input order in
    stateful mode, as the carried states depend on the row a sentence lands in."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    sentences = check_sentences(sentences)
    order = list(range(len(sentences)))
    if not bilm.stateful:
        order.sort(key=lambda i: -len(sentences[i]))
    results: list[numpy.ndarray | None] = [None] * len(sentences)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            layers = bilm(bilm.batch_to_ids([sentences[i] for i in indices])).layers
            layers = layers.float().cpu().numpy()
            for row, index in enumerate(indices):
                n = len(sentences[index])
                results[index] = numpy.ascontiguousarray(layers[:, row, :n])
            del layers  # not alive while the next batch runs
    return results  # type: ignore[return-value]
