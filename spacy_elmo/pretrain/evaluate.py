"""Held-out perplexity of a saved biLM with its softmax (`spacy-elmo perplexity`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..bilm import BiLM, batch_to_ids
from ..bilm.lm_head import LMHead
from .corpus import iter_input_files, iter_lines, pretokenized_splitter, spacy_sentence_splitter
from .vocab import Vocab


def load_language_model(model_dir: Path):
    """The biLM, its softmax and vocabulary from a `spacy-elmo pretrain` model directory."""
    from .trainer import LanguageModel, load_head, read_safetensors

    model_dir = Path(model_dir)
    head_path = model_dir / "lm_head.safetensors"
    if not head_path.exists():
        raise ValueError(
            f"{model_dir} has no lm_head.safetensors: perplexity needs a model written by "
            "`spacy-elmo pretrain` (converted AllenNLP models hold no softmax)"
        )
    bilm = BiLM.load(model_dir)
    vocab = Vocab.from_file(model_dir / "vocab.txt")
    head = LMHead(bilm.options.projection_dim, len(vocab))
    load_head(head, read_safetensors(head_path), str(head_path), model_dir / "vocab.txt")
    return LanguageModel(bilm, head, dropout=0.0).eval(), vocab


@torch.no_grad()
def perplexity(
    model_dir: Path,
    inputs: list[Path],
    pretokenized: bool = True,
    pipeline: str = "en",
    batch_tokens: int = 4096,
    max_sentence_tokens: int = 50,
) -> dict[str, Any]:
    """Forward, backward and average perplexity over every sentence of `inputs`."""
    from .trainer import target_tensor

    model, vocab = load_language_model(model_dir)
    splitter = pretokenized_splitter if pretokenized else spacy_sentence_splitter(pipeline)
    sums = torch.zeros(4, dtype=torch.float64)
    batch: list[list[str]] = []
    n_sentences = 0

    def run(sentences: list[list[str]]) -> None:
        ids, targets = batch_to_ids(sentences), target_tensor(sentences, vocab)
        sums.add_(model(ids, targets).double())

    for tokens in splitter(iter_lines(iter_input_files(inputs))):
        for start in range(0, len(tokens), max_sentence_tokens):
            sentence = tokens[start : start + max_sentence_tokens]
            width = max([len(s) for s in batch] + [len(sentence)]) + 2
            if batch and width * (len(batch) + 1) > batch_tokens:
                run(batch)
                batch = []
            batch.append(sentence)
            n_sentences += 1
    if batch:
        run(batch)
    if n_sentences == 0:
        raise ValueError(f"no sentences in {', '.join(str(p) for p in inputs)}")
    forward = math.exp(sums[0].item() / sums[1].item())
    backward = math.exp(sums[2].item() / sums[3].item())
    return {
        "sentences": n_sentences,
        "tokens": int(sums[1].item()) - n_sentences,  # targets minus one </S> per sentence
        "ppl_forward": forward,
        "ppl_backward": backward,
        "ppl": (forward + backward) / 2,
    }
