"""What pretraining optimises: the biLM with its softmax head (`LanguageModel`), its per-batch
sums and the loss made of them; and the model a run starts from (new, resumed or adapted),
checked to fit in memory before its weights exist."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..bilm import BiLM, BiLMOptions
from ..bilm.lm_head import LMHead
from ..weights.sources import BiLMSource, resolve_source
from ..weights.tensors import check_weights, read_safetensors
from .checkpoint import CHECKPOINT
from .config import PretrainConfig
from .corpus import TRAIN, read_sentences
from .distill import DistillationHeads, StaticVectors
from .presets import preset
from .vocab import Vocab

# exp() of more overflows a float: the largest mean NLL (nats a token) a perplexity can have.
MAX_LOG_FLOAT = math.log(sys.float_info.max)


class LanguageModel(nn.Module):
    """biLM + shared softmax: summed NLL of the forward and backward LMs."""

    def __init__(
        self, bilm: BiLM, head: LMHead, dropout: float, distill: Optional[DistillationHeads] = None
    ) -> None:
        super().__init__()
        self.bilm = bilm
        self.head = head
        self.dropout = dropout
        self.distill = distill

    def forward(
        self,
        char_ids: torch.Tensor,
        target_ids: torch.Tensor,
        vector_rows: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """(4,): forward NLL sum and count, backward NLL sum and count; with `vector_rows`, (8,):
        then the static-vector distance sums and counts (`distill.py`). `target_ids` (batch,
        time + 2): the word ids of <S> w_1 .. w_n </S>, -1 after."""
        acts = self.bilm.activations(char_ids)
        top_forward = F.dropout(acts.forward[-1], self.dropout, self.training)
        top_backward = F.dropout(acts.backward[-1], self.dropout, self.training)
        # The forward LM at position t predicts token t + 1; the backward LM token t - 1.
        forward_targets = target_ids[:, 1:]
        forward_valid = forward_targets >= 0
        backward_targets = target_ids[:, :-1]
        backward_valid = acts.mask[:, 1:] & (backward_targets >= 0)
        forward_nll = self.head.nll(
            top_forward[:, :-1][forward_valid], forward_targets[forward_valid]
        )
        backward_nll = self.head.nll(
            top_backward[:, 1:][backward_valid], backward_targets[backward_valid]
        )
        counts = torch.stack([forward_valid.sum(), backward_valid.sum()]).to(forward_nll.dtype)
        sums = torch.stack([forward_nll, counts[0], backward_nll, counts[1]])
        if self.distill is None or vector_rows is None:
            return sums
        distances = self.distill.losses(
            acts.token_embeddings, top_forward, top_backward, vector_rows
        )
        return torch.cat([sums, distances.to(sums.dtype)])


def target_tensor(sentences: list[list[str]], vocab: Vocab) -> torch.Tensor:
    """(batch, longest + 2) word ids of <S> w_1 .. w_n </S> per sentence, -1 after its end."""
    width = max(len(s) for s in sentences) + 2
    targets = torch.full((len(sentences), width), -1, dtype=torch.long)
    for i, sentence in enumerate(sentences):
        ids = [vocab.bos, *vocab.ids(sentence), vocab.eos]
        targets[i, : len(ids)] = torch.tensor(ids)
    return targets


def mean_loss(sums: torch.Tensor, vectors_weight: float) -> torch.Tensor:
    """The mean NLL of both LMs, plus `vectors_weight` times the mean static-vector distances."""
    loss = (sums[0] / sums[1].clamp(min=1) + sums[2] / sums[3].clamp(min=1)) / 2
    if sums.shape[0] > 4:
        distance = sums[4] / sums[5].clamp(min=1) + sums[6] / sums[7].clamp(min=1)
        loss = loss + vectors_weight * distance
    return loss


def perplexity_of(nll_sum: float, count: float) -> float:
    """exp(mean NLL): inf past what a float holds (not an OverflowError); NaN stays NaN."""
    mean = nll_sum / max(1.0, count)
    return math.exp(mean) if mean < MAX_LOG_FLOAT else (math.inf if mean == mean else math.nan)


def load_init_model(
    source: str | Path | BiLMSource,
) -> tuple[BiLM, Optional[Vocab], Optional[LMHead]]:
    """A biLM named as `weights.sources` takes it, with its vocabulary and softmax where it
    has them (the bundled biLM, a `spacy-elmo pretrain` run), else None for both."""
    resolved = source if isinstance(source, BiLMSource) else resolve_source(source)
    bilm = BiLM.load(resolved)
    directory = resolved.path
    if directory is None or resolved.kind not in ("bundled", "saved", "run"):
        return bilm, None, None
    vocab_path, head_path = directory / "vocab.txt", directory / "lm_head.safetensors"
    if not (vocab_path.exists() and head_path.exists()):
        return bilm, None, None
    vocab = Vocab.from_file(vocab_path)
    head = LMHead(bilm.options.projection_dim, len(vocab))
    load_head(head, read_safetensors(head_path), str(head_path), vocab_path)
    return bilm, vocab, head


def load_head(head: LMHead, state: dict[str, torch.Tensor], source: str, vocab_path) -> None:
    """Load softmax weights into `head`; ValueError when they are for another vocabulary."""
    check_weights(state, source)
    try:
        head.load_state_dict(state)
    except RuntimeError as err:  # torch names the tensors that differ in name or shape
        raise ValueError(
            f"the softmax in {source} does not match the vocabulary {vocab_path} "
            f"({head.vocab_size} words): {' '.join(str(err).split())}"
        ) from None


def build_language_model(
    config: PretrainConfig,
    work: Path,
    checkpoint: Optional[dict],
    device: torch.device,
    write_vocab: bool,
) -> tuple[LanguageModel, Vocab, Optional[StaticVectors]]:
    """The run's model on `device` (new, adapted from `init_from`, or resumed: the caller
    restores the `checkpoint`'s weights), its vocabulary (work/vocab.txt, written when
    `write_vocab`; kept unless a new run adapts a biLM that brings one) and static vectors."""
    init_vocab = init_head = None
    bilm: Optional[BiLM] = None
    if config.init_from:
        bilm, init_vocab, init_head = load_init_model(config.init_from)
        options = bilm.options
    elif config.options is not None:
        options = BiLMOptions.from_dict(config.options, source="options")
    else:
        options = BiLMOptions.from_dict(preset(config.preset), source=f"preset {config.preset}")
    vocab_path = work / "vocab.txt"
    if vocab_path.exists() and (checkpoint is not None or init_vocab is None):
        vocab = Vocab.from_file(vocab_path)
    elif init_vocab is not None:
        vocab = init_vocab
    else:
        vocab = Vocab.build(read_sentences(work / TRAIN), config.vocab_size, config.min_count)
    if write_vocab:
        vocab.to_file(vocab_path)
    check_memory(config, options, len(vocab), device)  # before the weights exist
    if bilm is None:
        bilm = BiLM(options)

    head = init_head if init_head is not None else LMHead(options.projection_dim, len(vocab))
    if checkpoint is not None:
        saved = checkpoint["model"]
        head_state = {k[5:]: v for k, v in saved.items() if k.startswith("head.")}
        load_head(head, head_state, f"checkpoint {work / CHECKPOINT}", vocab_path)
    for stack in (bilm.forward_lstm, bilm.backward_lstm):
        stack.dropout = config.dropout
    static_vectors = distill = None
    if config.static_vectors:
        static_vectors = StaticVectors.from_spacy(config.static_vectors)
        distill = DistillationHeads(options.projection_dim, static_vectors.table)
    model = LanguageModel(bilm, head, config.dropout, distill)
    model.to(device)
    return model, vocab, static_vectors


def estimate_memory_bytes(options: BiLMOptions, vocab_size: int, batch_tokens: int) -> int:
    """A generous estimate of training memory: weights, grads, Adam moments, activations."""
    head_params = options.projection_dim * min(vocab_size, 2 * 10**4) + vocab_size * 64
    params = options.n_parameters() + head_params
    d, p, f = options.lstm_dim, options.projection_dim, options.n_filters
    per_token = 2 * options.n_layers * (9 * d + 4 * p)  # gates, cell, tanh, outputs, grads
    per_token += 50 * f // 2 + 8 * f + 4 * p  # conv maps of distinct tokens, highway
    per_token += 2 * 2 * 2100  # head logits, both directions
    return params * 4 * 4 + batch_tokens * per_token * 4 * 3


def check_memory(config: PretrainConfig, options: BiLMOptions, vocab_size: int, device) -> None:
    """ValueError when the run needs more memory than `max_memory_gb`, else than `device` has."""
    need = estimate_memory_bytes(options, vocab_size, config.batch_tokens)
    if config.max_memory_gb is not None:
        have = int(config.max_memory_gb * 2**30)
    elif device.type == "cuda":
        have = torch.cuda.mem_get_info(device)[0]
    else:  # what Linux says new processes can take without swapping
        with open("/proc/meminfo") as handle:
            available = [line.split() for line in handle if line.startswith("MemAvailable:")]
        have = int(available[0][1]) * 1024 if available else 2**62
    if need > have:
        raise ValueError(
            f"this architecture ({options.n_parameters():,} biLM parameters, D={options.lstm_dim}, "
            f"P={options.projection_dim}) with batch_tokens={config.batch_tokens} needs about "
            f"{need / 2**30:.1f} GiB but only {have / 2**30:.1f} GiB is available; use a smaller "
            f"preset, fewer batch tokens or a bigger machine"
        )
