"""Held-out perplexity: of a run's model as it trains, and of a saved biLM with its softmax
(`spacy-elmo perplexity`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from ..bilm import batch_to_ids
from ..description.chars import batches_by_padded_tokens
from ..weights.sources import BiLMSource, resolve_source
from .config import PretrainConfig
from .corpus import cut_sentences, iter_input_files, iter_lines, sentence_splitter
from .objective import LanguageModel, load_init_model, perplexity_of, target_tensor
from .vocab import Vocab


@torch.no_grad()
def held_out_perplexity(
    model: LanguageModel, sentences: Iterable[list[str]], vocab: Vocab, batch_tokens: int
) -> dict[str, Any]:
    """Forward, backward and average perplexity over `sentences`, with what decides whether
    two compare: the vocabulary's size, the tokens scored, the share of them out of the
    vocabulary (scored as <UNK>)."""
    model.eval()
    device = next(model.parameters()).device
    sums = torch.zeros(4, dtype=torch.float64)
    n_sentences = n_oov = 0
    for batch in batches_by_padded_tokens(sentences, batch_tokens):
        n_sentences += len(batch)
        char_ids, targets = batch_to_ids(batch), target_tensor(batch, vocab)
        n_oov += int((targets == vocab.unk).sum().item())
        sums += model(char_ids.to(device), targets.to(device)).double().cpu()
    # A model this bad (a mean NLL past 709 nats) has an infinite perplexity, not an error.
    forward = perplexity_of(sums[0].item(), sums[1].item())
    backward = perplexity_of(sums[2].item(), sums[3].item())
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


def perplexity(
    model: str | Path | BiLMSource,
    inputs: list[Path],
    pretokenized: bool = True,
    lang: str = "en",
    pipeline: Optional[str] = None,
) -> dict[str, Any]:
    """`held_out_perplexity` of a saved biLM over every sentence of `inputs`, cut as
    pretraining cuts them."""
    source = model if isinstance(model, BiLMSource) else resolve_source(model)
    bilm, vocab, head = load_init_model(source)
    if vocab is None or head is None:
        raise ValueError(
            f"{source.describe()} has no softmax (lm_head.safetensors and vocab.txt): "
            "perplexity needs the bundled biLM or one written by `spacy-elmo pretrain` "
            "(bilm-tf/AllenNLP and ELMoForManyLangs files hold none)"
        )
    splitter = sentence_splitter(pretokenized, lang, pipeline)
    # Held-out text is refused, not skipped, where it is not text: a perplexity is of text.
    lines = iter_lines(iter_input_files(inputs, refuse_binary=True), not_text="refuse")
    sentences = cut_sentences(splitter(lines), PretrainConfig.max_sentence_tokens)
    language_model = LanguageModel(bilm, head, dropout=0.0)
    result = held_out_perplexity(language_model, sentences, vocab, batch_tokens=4096)
    if result["sentences"] == 0:
        raise ValueError(f"no sentences in {', '.join(str(p) for p in inputs)}")
    return result


def describe(result: dict[str, Any]) -> str:
    """`perplexity`'s result in a line."""
    return (
        f"perplexity {result['ppl']:.2f} (forward {result['ppl_forward']:.2f}, backward "
        f"{result['ppl_backward']:.2f}) over {result['tokens']:,} tokens in "
        f"{result['sentences']:,} sentences; vocabulary of {result['vocab_size']:,} words, "
        f"{result['oov_tokens']:,} tokens ({result['oov_rate']:.2%}) out of it, scored as <UNK>"
    )
