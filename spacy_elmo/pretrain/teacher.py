"""A transformer's contextual word vectors as targets of biLM pretraining (`teacher`).

A biLM that has read a few million words knows less about words in context than a transformer
that has read billions. The teacher (a Hugging Face encoder, e.g. all-MiniLM-L6-v2, or the
transformer component of a spaCy pipeline) reads each training sentence once; the vector of
every word at one of its layers becomes a target of the biLM's contextual layers, through a
training-only head (`TeacherHead`). The saved biLM keeps its layout and exports to bilm-tf.

Alignment: the sentence's words go to the teacher's tokenizer as pre-split words; a word's
vector is the mean of its word pieces' vectors at the chosen layer. A word without pieces
(nothing the tokenizer keeps) or with a piece cut off by the teacher's length limit gets no
target: both are counted (`TeacherCounts`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy
import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class TeacherCounts:
    """Words given a target, and words without one (no word piece; cut by the length limit)."""

    words: int = 0
    empty: int = 0
    cut: int = 0

    def add(self, other: TeacherCounts) -> None:
        self.words += other.words
        self.empty += other.empty
        self.cut += other.cut


class Teacher:
    """A Hugging Face encoder and its fast tokenizer: one vector per word at `layer`.

    `layer` indexes the encoder's hidden states: 0 is the embedding output, 1 .. L its layers,
    negative values count from the last (-1).
    """

    def __init__(self, model: Any, tokenizer: Any, layer: int, source: str) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"teacher {source}: its tokenizer is not a fast (Rust) tokenizer, which word-piece "
                f"alignment needs (a tokenizer.json in the model folder)"
            )
        n_layers = int(model.config.num_hidden_layers)
        if not -(n_layers + 1) <= layer <= n_layers:
            raise ValueError(
                f"teacher_layer {layer}: teacher {source} has hidden states 0 .. {n_layers} "
                f"(0 = embeddings; negative counts from the last)"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.layer = layer
        self.source = source
        self.dim = int(model.config.hidden_size)
        limits = [getattr(model.config, "max_position_embeddings", None)]
        limits.append(getattr(tokenizer, "model_max_length", None))
        self.max_length = min(int(v) for v in limits if v and v < 10**6)

    @classmethod
    def load(cls, source: str | Path, layer: int = -1) -> Teacher:
        """A Hugging Face model folder (config.json, weights, tokenizer.json), or a spaCy
        pipeline (a package name or directory) with a spacy-transformers component."""
        path = Path(source)
        if (path / "config.json").exists() and not (path / "meta.json").exists():
            try:
                from transformers import AutoModel, AutoTokenizer
            except ImportError:
                raise ValueError(
                    "a teacher needs the transformers package: pip install transformers"
                ) from None
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
                model = AutoModel.from_pretrained(str(path), local_files_only=True)
            except (OSError, ValueError) as err:
                first = str(err).splitlines()[0] if str(err) else repr(err)
                raise ValueError(
                    f"teacher {source}: not a loadable model folder ({first})"
                ) from None
            return cls(model, tokenizer, layer, str(source))
        return cls._from_spacy(str(source), layer)

    @classmethod
    def _from_spacy(cls, source: str, layer: int) -> Teacher:
        import spacy

        try:
            nlp = spacy.load(source)
        except (OSError, ValueError) as err:
            first = str(err).splitlines()[0] if str(err) else repr(err)
            raise ValueError(
                f"teacher {source}: neither a Hugging Face model folder (config.json) nor a "
                f"spaCy pipeline ({first})"
            ) from None
        for name, pipe in nlp.pipeline:
            model = getattr(pipe, "model", None)
            try:
                encoder, tokenizer = model.transformer, model.tokenizer
            except (AttributeError, IndexError, KeyError):
                continue
            if encoder is not None and tokenizer is not None:
                return cls(encoder, tokenizer, layer, f"{source} ({name})")
        raise ValueError(
            f"teacher {source}: the pipeline ({', '.join(nlp.pipe_names) or 'no components'}) has "
            f"no transformer component (spacy-transformers)"
        )

    def identity(self) -> str:
        """sha256 of the encoder's weights, the tokenizer's vocabulary and the layer."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        for piece, index in sorted(self.tokenizer.get_vocab().items()):
            digest.update(f"{piece}\t{index}\n".encode())
        digest.update(f"layer={self.layer};max_length={self.max_length}".encode())
        return digest.hexdigest()

    @torch.no_grad()
    def word_vectors(
        self, sentences: Sequence[Sequence[str]]
    ) -> tuple[list[numpy.ndarray], TeacherCounts]:
        """Each sentence's (n_words, dim) float32 word vectors (the mean of the word's pieces),
        NaN rows for words without a target; and the counts."""
        counts = TeacherCounts()
        vectors = [numpy.full((len(s), self.dim), numpy.nan, numpy.float32) for s in sentences]
        todo = [i for i, s in enumerate(sentences) if s]
        if not todo:
            return vectors, counts
        words = [list(sentences[i]) for i in todo]
        # Pieces of every word without the limit, to tell a word cut short from a whole one.
        full = self.tokenizer(words, is_split_into_words=True, add_special_tokens=False)
        encoded = self.tokenizer(
            words,
            is_split_into_words=True,
            truncation=True,
            max_length=self.max_length,
            padding=True,
            return_tensors="pt",
        )
        outputs = self.model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            output_hidden_states=True,
        )
        hidden = outputs.hidden_states[self.layer].float()  # (batch, pieces, dim)
        for row, index in enumerate(todo):
            n_words = len(sentences[index])
            wanted = numpy.bincount(
                [w for w in full.word_ids(row) if w is not None], minlength=n_words
            )
            piece_words = encoded.word_ids(row)
            kept = [(p, w) for p, w in enumerate(piece_words) if w is not None]
            got = numpy.bincount([w for _, w in kept], minlength=n_words)
            sums = torch.zeros(n_words, self.dim)
            if kept:
                positions = torch.tensor([p for p, _ in kept])
                owners = torch.tensor([w for _, w in kept])
                sums.index_add_(0, owners, hidden[row, positions])
            whole = (got == wanted) & (wanted > 0)
            means = sums[torch.from_numpy(whole)] / torch.from_numpy(got[whole]).float()[:, None]
            vectors[index][whole] = means.numpy()
            counts.words += int(whole.sum())
            counts.empty += int((wanted == 0).sum())
            counts.cut += int(((got != wanted) & (wanted > 0)).sum())
        return vectors, counts


class TeacherHead(nn.Module):
    """Training only: maps the biLM's contextual layers at a position (every LSTM layer,
    forward and backward) to the teacher's vector of the word there; cosine distance loss."""

    def __init__(self, n_layers: int, projection_dim: int, teacher_dim: int) -> None:
        super().__init__()
        self.map = nn.Linear(2 * n_layers * projection_dim, teacher_dim)

    def losses(
        self,
        forward: Sequence[torch.Tensor],
        backward: Sequence[torch.Tensor],
        targets: torch.Tensor,
        dropout: float = 0.0,
    ) -> torch.Tensor:
        """(2,): the summed cosine distance and the number of words with a target.

        `forward` and `backward` are L x (batch, time + 2, P) with <S> at 0; `targets`
        (batch, time + 2, teacher dim) holds the standardised teacher vectors, NaN where none.
        """
        valid = ~torch.isnan(targets[..., 0])
        hidden = torch.cat([*forward, *backward], dim=-1)[valid]  # (words, 2 L P)
        hidden = F.dropout(hidden, dropout, self.training)
        count = valid.sum()
        if hidden.shape[0] == 0:
            return torch.stack([hidden.sum() * 0.0, count.to(hidden.dtype)])
        predicted = F.normalize(self.map(hidden).float(), dim=-1)
        target = F.normalize(targets[valid].float(), dim=-1)
        distance = (1.0 - (predicted * target).sum(dim=-1)).sum()
        return torch.stack([distance, count.to(distance.dtype)])
