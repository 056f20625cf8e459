"""Held-out perplexity of a saved biLM with its softmax (`spacy-elmo perplexity`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from ..bilm import batch_to_ids
from ..description.chars import batches_by_padded_tokens
from ..weights.sources import BiLMSource, resolve_source
from .corpus import cut_sentences, iter_input_files, iter_lines, sentence_splitter
from .objective import LanguageModel, directional_perplexities, load_init_model, target_tensor


@torch.no_grad()
def perplexity(
    model: str | Path | BiLMSource,
    inputs: list[Path],
    pretokenized: bool = True,
    lang: str = "en",
    pipeline: Optional[str] = None,
    batch_tokens: int = 4096,
    max_sentence_tokens: int = 50,
) -> dict[str, Any]:
    """Forward, backward and average perplexity over every sentence of `inputs`, with what
    decides whether two compare: the vocabulary's size, the tokens scored, the share of them
    out of the vocabulary (scored as <UNK>)."""
    source = model if isinstance(model, BiLMSource) else resolve_source(model)
    bilm, vocab, head = load_init_model(source)
    if vocab is None or head is None:
        raise ValueError(
            f"{source.describe()} has no softmax (lm_head.safetensors and vocab.txt): "
            "perplexity needs the bundled biLM or one written by `spacy-elmo pretrain` "
            "(bilm-tf/AllenNLP and ELMoForManyLangs files hold none)"
        )
    language_model = LanguageModel(bilm, head, dropout=0.0).eval()
    splitter = sentence_splitter(pretokenized, lang, pipeline)
    # Held-out text is refused, not skipped, where it is not text: a perplexity is of text.
    lines = iter_lines(iter_input_files(inputs, refuse_binary=True), not_text="refuse")
    sentences = cut_sentences(splitter(lines), max_sentence_tokens)
    sums = torch.zeros(4, dtype=torch.float64)
    n_sentences = n_oov = 0
    for batch in batches_by_padded_tokens(sentences, batch_tokens):
        n_sentences += len(batch)
        ids, targets = batch_to_ids(batch), target_tensor(batch, vocab)
        n_oov += int((targets == vocab.unk).sum().item())
        sums.add_(language_model(ids, targets).double())
    if n_sentences == 0:
        raise ValueError(f"no sentences in {', '.join(str(p) for p in inputs)}")
    # A model this bad (a mean NLL past 709 nats) has an infinite perplexity, not an error.
    forward, backward = directional_perplexities(sums)
    tokens = int(sums[1].item()) - n_sentences  # targets minus one </S> per sentence
    return {
        "sentences": n_sentences,
        "tokens": tokens,
        # Each direction's perplexity is over the tokens and one sentence boundary a sentence
        # (</S> forward, <S> backward).
        "targets_per_direction": int(sums[1].item()),
        "vocab_size": len(vocab),
        "oov_tokens": n_oov,
        "oov_rate": n_oov / tokens if tokens else 0.0,
        "unk_targets": "included",  # an out-of-vocabulary token is scored as <UNK>
        "ppl_forward": forward,
        "ppl_backward": backward,
        "ppl": (forward + backward) / 2,
    }


def describe(result: dict[str, Any]) -> str:
    """`perplexity`'s result in a line."""
    return (
        f"perplexity {result['ppl']:.2f} (forward {result['ppl_forward']:.2f}, backward "
        f"{result['ppl_backward']:.2f}) over {result['tokens']:,} tokens in "
        f"{result['sentences']:,} sentences; vocabulary of {result['vocab_size']:,} words, "
        f"{result['oov_tokens']:,} tokens ({result['oov_rate']:.2%}) out of it, scored as <UNK>"
    )
