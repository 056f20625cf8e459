"""Static word vectors as auxiliary targets of pretraining (`static_vectors`): training-only
heads pull each word's char-CNN vector and the LSTM output predicting it towards its static
vector (docs/research/pretrain-probes.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy
import torch
from torch import nn
from torch.nn import functional as F

NO_VECTOR = -1


class StaticVectors:
    """Unit-normalised rows of a spaCy vectors table and a word -> row lookup."""

    def __init__(self, table: numpy.ndarray, rows: dict[str, int]) -> None:
        if not numpy.isfinite(table).all():
            raise ValueError("static vectors: the table holds NaN or infinite values")
        norms = numpy.linalg.norm(table, axis=1, keepdims=True)
        self.table = torch.from_numpy(table / numpy.maximum(norms, 1e-8)).float()
        self.has_vector = norms[:, 0] > 0
        self._rows = rows

    @classmethod
    def from_spacy(cls, name_or_path: str | Path) -> StaticVectors:
        """The vectors of a spaCy pipeline (a package name or a pipeline directory)."""
        import spacy

        try:
            nlp = spacy.load(name_or_path, exclude=["*"])
        except OSError as err:
            raise ValueError(
                f"static_vectors {name_or_path}: not a spaCy pipeline with vectors ({err})"
            ) from None
        vectors = nlp.vocab.vectors
        if vectors.shape[0] == 0 or vectors.shape[1] == 0:
            raise ValueError(f"static_vectors {name_or_path}: the pipeline has no vectors")
        table = numpy.asarray(vectors.data, dtype=numpy.float32)
        strings = nlp.vocab.strings
        rows = {strings[key]: int(row) for key, row in vectors.key2row.items() if key in strings}
        return cls(table, rows)

    def row(self, word: str) -> int:
        """The table row of `word` (exact form, else lower case), or NO_VECTOR."""
        row = self._rows.get(word, self._rows.get(word.lower(), NO_VECTOR))
        return row if row != NO_VECTOR and self.has_vector[row] else NO_VECTOR

    def target_rows(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """(batch, time + 2) rows of <S> w_1 .. w_n </S>: NO_VECTOR at boundaries and padding."""
        width = max(len(s) for s in sentences) + 2
        rows = torch.full((len(sentences), width), NO_VECTOR, dtype=torch.long)
        for i, sentence in enumerate(sentences):
            if sentence:
                rows[i, 1 : len(sentence) + 1] = torch.tensor([self.row(w) for w in sentence])
        return rows


class DistillationHeads(nn.Module):
    """The token and context maps (P -> vector dim) and their cosine losses."""

    def __init__(self, dim: int, table: torch.Tensor) -> None:
        super().__init__()
        self.token = nn.Linear(dim, table.shape[1])
        self.context = nn.Linear(dim, table.shape[1])
        self.register_buffer("table", table, persistent=False)

    def losses(
        self,
        token_embeddings: torch.Tensor,
        top_forward: torch.Tensor,
        top_backward: torch.Tensor,
        rows: torch.Tensor,
    ) -> torch.Tensor:
        """(4,): summed token cosine distance, its count, summed context distance, its count.
        `rows` (batch, time + 2): each position's row (NO_VECTOR: none); outputs (.., P).
        """
        token_valid = rows >= 0
        token = self._distance(self.token, token_embeddings[token_valid], rows[token_valid])
        # The forward LM at t predicts word t + 1, the backward LM word t - 1.
        next_rows, previous_rows = rows[:, 1:], rows[:, :-1]
        forward_valid, backward_valid = next_rows >= 0, previous_rows >= 0
        context = self._distance(
            self.context, top_forward[:, :-1][forward_valid], next_rows[forward_valid]
        ) + self._distance(
            self.context, top_backward[:, 1:][backward_valid], previous_rows[backward_valid]
        )
        context_count = forward_valid.sum() + backward_valid.sum()
        return torch.stack(
            [token, token_valid.sum().to(token.dtype), context, context_count.to(context.dtype)]
        )

    def _distance(self, head: nn.Linear, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Summed cosine distance between head(hidden) and the rows' unit vectors."""
        if rows.numel() == 0:
            return hidden.sum() * 0.0
        predicted = F.normalize(head(hidden).float(), dim=-1)
        return (1.0 - (predicted * self.table[rows]).sum(dim=-1)).sum()
