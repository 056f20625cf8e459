"""Train a biLM with forward and backward language-model losses (`spacy-elmo pretrain`).

Resumable bit for bit: a checkpoint holds the weights, optimizer, scheduler, RNG state and
the number of batches consumed; the batch stream is a pure function of (seed, corpus), so a
resumed run skips the consumed batches and continues exactly where the killed run was.
Under `torchrun` it trains with DistributedDataParallel, rank r taking every r-th batch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Collection, Iterator, Optional

import torch
from torch import nn
from torch.nn import functional as F

from ..atomic_files import write_text
from ..bilm import BiLM, BiLMOptions, batch_to_ids
from ..bilm.batching import batches_by_padded_tokens
from ..bilm.io import check_finite, read_safetensors, write_safetensors
from ..bilm.lm_head import LMHead
from .checkpoint import load_checkpoint, save_checkpoint
from .corpus import (
    iter_batches,
    iter_input_files,
    pretokenized_splitter,
    read_sentences,
    spacy_sentence_splitter,
    write_tokenized,
)
from .distill import DistillationHeads, StaticVectors
from .presets import preset
from .rundir import RunDirectoryLock, prepare_run_directory
from .vocab import Vocab

logger = logging.getLogger("spacy_elmo.pretrain")

CHECKPOINT = "checkpoints/last.pt"
METRICS = "metrics.jsonl"
DEFAULT_MAX_STEPS = 10000


@dataclass
class PretrainConfig:
    """Everything that defines a pretraining run (saved in every checkpoint)."""

    inputs: list[str]
    output: str
    preset: str = "bundled"
    options: Optional[dict[str, Any]] = None  # bilm-tf options; overrides `preset`
    dev: list[str] = field(default_factory=list)  # else every `dev_every`-th sentence
    dev_every: int = 100
    max_dev_sentences: int = 2000
    pipeline: str = "en"  # spaCy pipeline name/path or language code for raw text
    pretokenized: bool = False
    vocab_size: int = 50000
    min_count: int = 3
    max_sentence_tokens: int = 50
    batch_tokens: int = 2048
    max_steps: Optional[int] = None  # None: DEFAULT_MAX_STEPS, or the checkpoint's on resume
    learning_rate: float = 2e-3
    warmup_steps: int = 200
    dropout: float = 0.1
    clip_norm: float = 10.0
    eval_every: int = 500
    checkpoint_every: int = 200
    log_every: int = 20
    seed: int = 0
    gpu_id: int = -1
    mixed_precision: bool = False
    init_from: Optional[str] = None
    export_allennlp: bool = False
    max_memory_gb: Optional[float] = None
    threads: Optional[int] = None
    static_vectors: Optional[str] = None  # spaCy pipeline whose vectors are auxiliary targets
    vectors_weight: float = 1.0  # weight of each of the two cosine losses (distill.py)

    def __post_init__(self) -> None:
        """Raise ValueError naming the setting (and its flag) whose value cannot work."""
        for name, (kind, low, exclusive, high, optional) in _BOUNDS.items():
            value = getattr(self, name)
            if value is None and optional:
                continue
            ok = isinstance(value, kind) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value > low if exclusive else value >= low)
            ok = ok and (high is None or value < high)
            if not ok:
                what = "an integer" if kind is int else "a number"
                bounds = f"{'>' if exclusive else '>='} {low}" + (f" and < {high}" if high else "")
                flag = _FLAGS.get(name, name.replace("_", "-"))
                raise ValueError(f"--{flag} ({name}) must be {what} {bounds}, got {value!r}")
        for name in ("inputs", "dev"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of paths (strings), got {value!r}")
        if not self.inputs:
            raise ValueError("no pretraining inputs given")
        for name in ("output", "preset", "pipeline"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")


# setting -> (type, lower bound, whether it is exclusive, exclusive upper bound, None allowed)
_BOUNDS: dict[str, tuple[Any, float, bool, Optional[float], bool]] = {
    "dev_every": (int, 1, False, None, False),
    "max_dev_sentences": (int, 1, False, None, False),
    "vocab_size": (int, 4, False, None, False),
    "min_count": (int, 1, False, None, False),
    "max_sentence_tokens": (int, 1, False, None, False),
    "batch_tokens": (int, 1, False, None, False),
    "max_steps": (int, 1, False, None, True),
    "warmup_steps": (int, 0, False, None, False),
    "eval_every": (int, 1, False, None, False),
    "checkpoint_every": (int, 1, False, None, False),
    "log_every": (int, 1, False, None, False),
    "seed": (int, 0, False, None, False),
    "gpu_id": (int, -1, False, None, False),
    "threads": (int, 1, False, None, True),
    "learning_rate": ((int, float), 0, True, None, False),
    "dropout": ((int, float), 0, False, 1, False),
    "clip_norm": ((int, float), 0, True, None, False),
    "vectors_weight": ((int, float), 0, False, None, False),
    "max_memory_gb": ((int, float), 0, True, None, True),
}
_FLAGS = {"learning_rate": "lr"}
# Where the run is, not what it trains: may differ on resume (the directory was moved).
_LOCATION_SETTINGS = ("output",)


class LanguageModel(nn.Module):
    """biLM + shared softmax: summed NLL of the forward and backward LMs."""

    def __init__(
        self,
        bilm: BiLM,
        head: LMHead,
        dropout: float,
        distill: Optional[DistillationHeads] = None,
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
        """(4,) tensor: forward NLL sum, forward count, backward NLL sum, backward count.

        `target_ids` (batch, time + 2) holds the word ids of <S> w_1 .. w_n </S>, -1 after.
        With distillation heads and `vector_rows` (static-vector rows of the same positions),
        (8,): then the token and context cosine-distance sums and counts (`distill.py`).
        """
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
        sums = torch.stack(
            [
                forward_nll,
                forward_valid.sum().to(forward_nll.dtype),
                backward_nll,
                backward_valid.sum().to(backward_nll.dtype),
            ]
        )
        if self.distill is None or vector_rows is None:
            return sums
        distances = self.distill.losses(
            acts.token_embeddings, top_forward, top_backward, vector_rows
        )
        return torch.cat([sums, distances.to(sums.dtype)])


def target_tensor(sentences: list[list[str]], vocab: Vocab) -> torch.Tensor:
    width = max(len(s) for s in sentences) + 2
    targets = torch.full((len(sentences), width), -1, dtype=torch.long)
    for i, sentence in enumerate(sentences):
        ids = [vocab.bos, *vocab.ids(sentence), vocab.eos]
        targets[i, : len(ids)] = torch.tensor(ids)
    return targets


# ---------------------------------------------------------------------- set-up
def prepare_corpus(config: PretrainConfig, work: Path) -> tuple[Path, Path]:
    """Tokenise the inputs once into work/corpus/{train,dev}.txt (skipped when present)."""
    train, dev = work / "corpus" / "train.txt", work / "corpus" / "dev.txt"
    if train.exists() and dev.exists():
        return train, dev
    splitter = (
        pretokenized_splitter if config.pretokenized else spacy_sentence_splitter(config.pipeline)
    )
    files = iter_input_files(config.inputs)
    if not files:
        raise ValueError(f"no usable text files in {', '.join(config.inputs)}")
    if config.dev:
        dev_files = iter_input_files(config.dev)
        write_tokenized(files, train, splitter, config.max_sentence_tokens)
        write_tokenized(dev_files, dev, splitter, config.max_sentence_tokens)
    else:
        write_tokenized(files, train, splitter, config.max_sentence_tokens, dev, config.dev_every)
    return train, dev


def build_options(config: PretrainConfig) -> BiLMOptions:
    raw = config.options if config.options is not None else preset(config.preset)
    return BiLMOptions.from_dict(
        raw, source=f"preset {config.preset}" if config.options is None else "options"
    )


def load_init_model(path: str) -> tuple[BiLM, Optional[Vocab], Optional[dict]]:
    """A saved biLM directory (with its softmax if it has one) or a bilm-tf options+hdf5 pair."""
    directory = Path(path)
    if (directory / "config.json").exists():
        bilm = BiLM.load(directory)
        if (directory / "vocab.txt").exists() and (directory / "lm_head.safetensors").exists():
            vocab = Vocab.from_file(directory / "vocab.txt")
            head_path = directory / "lm_head.safetensors"
            head = LMHead(bilm.options.projection_dim, len(vocab))
            load_head(head, read_safetensors(head_path), str(head_path), directory / "vocab.txt")
            return bilm, vocab, head.state_dict()
        return bilm, None, None
    weights = sorted(directory.glob("*weights*.hdf5")) if directory.is_dir() else []
    options = sorted(directory.glob("*options*.json")) if directory.is_dir() else []
    if len(weights) == 1 and len(options) == 1:
        return BiLM.from_allennlp(options[0], weights[0]), None, None
    raise ValueError(
        f"--init-from {path}: expected a saved biLM directory (config.json + model.safetensors) "
        f"or a directory with one *options*.json and one *weights*.hdf5 file"
    )


def load_head(head: LMHead, state: dict[str, torch.Tensor], source: str, vocab_path) -> None:
    """Load softmax weights into `head`; ValueError when they are for another vocabulary."""
    expected = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items()}
    if expected != found:
        keys = expected.keys() | found.keys()
        differ = sorted(k for k in keys if expected.get(k) != found.get(k))
        raise ValueError(
            f"the softmax in {source} does not match the vocabulary {vocab_path} "
            f"({head.vocab_size} words): tensor '{differ[0]}' has shape {found.get(differ[0])}, "
            f"expected {expected.get(differ[0])}"
        )
    check_finite(state, source)
    head.load_state_dict(state)


def resumed_config(
    saved: dict[str, Any], given: PretrainConfig, source: Path, explicit: Optional[Collection[str]]
) -> PretrainConfig:
    """The checkpoint's configuration, after checking that `given` does not contradict it.

    Only `max_steps` may change on resume, and only when given (not None). With `explicit`
    (the names of the settings given on the command line) only those are compared; the others
    are taken from the checkpoint.
    """
    unknown = sorted(set(saved) - {f.name for f in fields(PretrainConfig)})
    if unknown:
        raise ValueError(
            f"checkpoint {source} has settings this spacy-elmo does not know ({', '.join(unknown)})"
        )
    try:
        config = PretrainConfig(**saved)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {source}: bad settings: {err}") from None
    changed = []
    for f in fields(PretrainConfig):
        if f.name in (*_LOCATION_SETTINGS, "max_steps"):
            continue
        if explicit is not None and f.name not in explicit:
            continue
        old, new = getattr(config, f.name), getattr(given, f.name)
        if not _same_setting(f.name, old, new):
            flag = _FLAGS.get(f.name, f.name.replace("_", "-"))
            changed.append(f"--{flag} is {new!r}, the run was started with {old!r}")
    if changed:
        raise ValueError(
            f"--resume: {'; '.join(changed)} (checkpoint {source}). A resumed run keeps its "
            f"settings; only --max-steps may change. Start a new run to change the others "
            f"(another --output, or --overwrite)"
        )
    max_steps = given.max_steps if given.max_steps is not None else config.max_steps
    return replace(config, output=given.output, max_steps=max_steps)


def _same_setting(name: str, old: Any, new: Any) -> bool:
    """Equal settings; paths are equal when they name the same file from here."""
    if name in ("inputs", "dev") and isinstance(old, list) and isinstance(new, list):
        return [os.path.realpath(p) for p in old] == [os.path.realpath(p) for p in new]
    if name == "init_from" and old is not None and new is not None:
        return os.path.realpath(old) == os.path.realpath(new)
    return old == new


def estimate_memory_bytes(options: BiLMOptions, vocab_size: int, batch_tokens: int) -> int:
    """A generous estimate of training memory: weights, grads, Adam moments, activations."""
    head_params = options.projection_dim * min(vocab_size, 2 * 10**4) + vocab_size * 64
    params = options.n_parameters() + head_params
    d, p, f = options.lstm_dim, options.projection_dim, options.n_filters
    per_token = 2 * options.n_layers * (9 * d + 4 * p)  # gates, cell, tanh, outputs, grads
    per_token += 50 * f // 2 + 8 * f + 4 * p  # conv maps of distinct tokens, highway
    per_token += 2 * 2 * 2100  # head logits, both directions
    return params * 4 * 4 + batch_tokens * per_token * 4 * 3


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 2**62  # pragma: no cover - non-Linux


def check_memory(config: PretrainConfig, options: BiLMOptions, vocab_size: int, device) -> None:
    need = estimate_memory_bytes(options, vocab_size, config.batch_tokens)
    have = (
        int(config.max_memory_gb * 2**30)
        if config.max_memory_gb is not None
        else available_memory_bytes(device)
    )
    if need > have:
        raise ValueError(
            f"this architecture ({options.n_parameters():,} biLM parameters, D={options.lstm_dim}, "
            f"P={options.projection_dim}) with batch_tokens={config.batch_tokens} needs about "
            f"{need / 2**30:.1f} GiB but only {have / 2**30:.1f} GiB is available; use a smaller "
            f"preset, fewer batch tokens or a bigger machine"
        )


# ---------------------------------------------------------------------- the run
class Pretrainer:
    """One pretraining run in `config.output`; call it with the directory locked (`pretrain`).

    With `resume`, the run continues from its checkpoint with the checkpoint's settings (see
    `resumed_config` for what `config` may change, and `explicit`).
    """

    def __init__(
        self,
        config: PretrainConfig,
        resume: bool = False,
        explicit: Optional[Collection[str]] = None,
    ) -> None:
        self.work = Path(config.output)
        self.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        checkpoint = None
        if resume:
            path = self.work / CHECKPOINT
            checkpoint = load_checkpoint(path)
            config = resumed_config(checkpoint["config"], config, path, explicit)
        elif config.max_steps is None:
            config = replace(config, max_steps=DEFAULT_MAX_STEPS)
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = torch.device(f"cuda:{config.gpu_id}" if config.gpu_id >= 0 else "cpu")
        if self.distributed and not torch.distributed.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend)
        self.is_main = self.rank == 0
        torch.manual_seed(config.seed)

        if self.is_main:
            self.train_path, self.dev_path = prepare_corpus(config, self.work)
        self._barrier()
        self.train_path = self.work / "corpus" / "train.txt"
        self.dev_path = self.work / "corpus" / "dev.txt"
        if self.is_main and next(read_sentences(self.dev_path), None) is None:
            raise ValueError(f"the held-out file {self.dev_path} has no sentences")

        init_vocab = init_head = None
        bilm: Optional[BiLM] = None
        if config.init_from:
            bilm, init_vocab, init_head = load_init_model(config.init_from)
            options = bilm.options
        else:
            options = build_options(config)
        vocab_path = self.work / "vocab.txt"
        if vocab_path.exists() and (resume or init_vocab is None):
            vocab = Vocab.from_file(vocab_path)
        elif init_vocab is not None:
            vocab = init_vocab
        else:
            vocab = Vocab.build(
                read_sentences(self.train_path), config.vocab_size, config.min_count
            )
        if self.is_main:
            vocab.to_file(vocab_path)
        self.vocab = vocab
        check_memory(config, options, len(vocab), self.device)  # before the weights exist
        if bilm is None:
            bilm = BiLM(options)

        head = LMHead(options.projection_dim, len(vocab))
        if init_head is not None:
            head.load_state_dict(init_head)
        if checkpoint is not None:
            saved = checkpoint["model"]
            head_state = {k[5:]: v for k, v in saved.items() if k.startswith("head.")}
            load_head(head, head_state, f"checkpoint {self.work / CHECKPOINT}", vocab_path)
        for stack in (bilm.forward_lstm, bilm.backward_lstm):
            stack.dropout = config.dropout
        self.static_vectors = distill = None
        if config.static_vectors:
            self.static_vectors = StaticVectors.from_spacy(config.static_vectors)
            distill = DistillationHeads(options.projection_dim, self.static_vectors.table)
        self.model = LanguageModel(bilm, head, config.dropout, distill).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self.tokens_seen = 0
        self.train_seconds = 0.0
        if checkpoint is not None:
            self._restore(checkpoint)
            if self.is_main:
                _truncate_metrics(self.work / METRICS, self.step)
        self.train_module: nn.Module = self.model
        if self.distributed:
            # The adaptive softmax leaves the tail clusters without a target in a batch unused:
            # their gradients differ in presence between ranks.
            self.train_module = nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=True,
            )
        self.stop_requested = False

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        """Weights, optimizer, scheduler and RNG state from a checked checkpoint."""
        try:
            self.model.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.scheduler.load_state_dict(checkpoint["scheduler"])
            torch.set_rng_state(checkpoint["torch_rng"])
            if self.device.type == "cuda" and checkpoint.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(checkpoint["cuda_rng"], self.device)
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"checkpoint {self.work / CHECKPOINT} does not fit this run's model: "
                f"{str(err).splitlines()[0] if str(err) else err!r}"
            ) from None
        self.step = checkpoint["step"]
        self.tokens_seen = checkpoint["tokens_seen"]
        self.train_seconds = float(checkpoint["train_seconds"])

    def _lr_factor(self, step: int) -> float:
        """Linear warm-up, then linear decay to 10% at max_steps."""
        warmup, total = self.config.warmup_steps, max(1, self.config.max_steps)
        if step < warmup:
            return (step + 1) / warmup
        return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, total - warmup))

    def _barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    # ------------------------------------------------------------------ batches
    def _my_batches(self) -> Iterator[tuple[int, list[list[str]]]]:
        """This rank's batches from the global stream, after the ones already consumed."""
        stream = iter_batches(self.train_path, self.config.seed, self.config.batch_tokens)
        skip = self.step * self.world
        for index, (epoch, batch) in enumerate(stream):
            if index < skip or index % self.world != self.rank:
                continue
            yield epoch, batch

    def _loss(self, sentences: list[list[str]], module: nn.Module) -> torch.Tensor:
        char_ids = batch_to_ids(sentences).to(self.device)
        targets = target_tensor(sentences, self.vocab).to(self.device)
        rows = None
        if self.static_vectors is not None:
            rows = self.static_vectors.target_rows(sentences).to(self.device)
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.config.mixed_precision
        ):
            return module(char_ids, targets, rows).float()

    def _objective(self, sums: torch.Tensor) -> torch.Tensor:
        """Mean NLL of both LMs, plus the weighted mean cosine distances when distilling."""
        loss = (sums[0] / sums[1].clamp(min=1) + sums[2] / sums[3].clamp(min=1)) / 2
        if sums.shape[0] > 4:
            distance = sums[4] / sums[5].clamp(min=1) + sums[6] / sums[7].clamp(min=1)
            loss = loss + self.config.vectors_weight * distance
        return loss

    # ------------------------------------------------------------------ loop
    def train(self) -> dict[str, Any]:
        from tqdm import tqdm

        config = self.config
        previous = signal.signal(signal.SIGINT, self._request_stop)
        bar = tqdm(total=config.max_steps, initial=self.step, disable=not self.is_main, unit="step")
        window_tokens, window_start = 0, time.perf_counter()
        window_nll = torch.zeros(8 if self.static_vectors is not None else 4)
        epoch = 0
        try:
            batches = self._my_batches()
            while self.step < config.max_steps and not self._should_stop():
                start = time.perf_counter()
                epoch, sentences = next(batches)
                self.model.train()
                sums = self._loss(sentences, self.train_module)
                loss = self._objective(sums)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                n_tokens = sum(len(s) for s in sentences) * self.world
                self.tokens_seen += n_tokens
                window_tokens += n_tokens
                window_nll += sums.detach().cpu()
                self.train_seconds += time.perf_counter() - start
                bar.update(1)
                if self.step % config.log_every == 0 or self.step == config.max_steps:
                    elapsed = time.perf_counter() - window_start
                    ppl = math.exp(
                        (window_nll[0] + window_nll[2]).item()
                        / max(1.0, (window_nll[1] + window_nll[3]).item())
                    )
                    record = {
                        "step": self.step,
                        "epoch": epoch,
                        "tokens": self.tokens_seen,
                        "train_ppl": ppl,
                        "lr": self.scheduler.get_last_lr()[0],
                        "tokens_per_s": window_tokens / max(elapsed, 1e-9),
                        "train_seconds": self.train_seconds,
                    }
                    if window_nll.shape[0] > 4:
                        record["token_cosine"] = (window_nll[4] / window_nll[5].clamp(min=1)).item()
                        record["context_cosine"] = (
                            window_nll[6] / window_nll[7].clamp(min=1)
                        ).item()
                    bar.set_postfix(
                        loss=f"{math.log(ppl):.3f}",
                        ppl=f"{ppl:.1f}",
                        tok_s=f"{record['tokens_per_s']:.0f}",
                    )
                    self._log(record)
                    window_tokens, window_start = 0, time.perf_counter()
                    window_nll = torch.zeros_like(window_nll)
                if self.step % config.eval_every == 0 or self.step == config.max_steps:
                    self._log({"step": self.step, **self.evaluate()})
                if self.step % config.checkpoint_every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
            signal.signal(signal.SIGINT, previous)
        self.save_checkpoint()
        if self.stop_requested:
            if self.is_main:
                logger.warning(
                    "interrupted: checkpoint written at step %d; rerun with --resume", self.step
                )
            return {"interrupted": True, "step": self.step}
        summary = self.finish()
        return summary

    def _request_stop(self, signum, frame) -> None:  # noqa: ARG002
        self.stop_requested = True

    def _should_stop(self) -> bool:
        if not self.distributed:
            return self.stop_requested
        flag = torch.tensor([1.0 if self.stop_requested else 0.0], device=self.device)
        torch.distributed.all_reduce(flag)  # on the device: NCCL reduces CUDA tensors only
        self.stop_requested = flag.item() > 0
        return self.stop_requested

    def _log(self, record: dict[str, Any]) -> None:
        if self.is_main:
            with (self.work / METRICS).open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out perplexity of the forward and backward LMs, and their average."""
        if not self.is_main:
            return {}
        self.model.eval()
        sums = torch.zeros(4)
        sentences = self._dev_sentences()
        sentences.sort(key=len)
        for batch in batches_by_padded_tokens(sentences, self.config.batch_tokens):
            sums += self._loss(batch, self.model)[:4].cpu()
        if sums[1].item() == 0:  # not a perplexity of 1.0
            raise ValueError(f"the held-out file {self.dev_path} has no sentences")
        forward = math.exp(sums[0].item() / max(1.0, sums[1].item()))
        backward = math.exp(sums[2].item() / max(1.0, sums[3].item()))
        return {
            "dev_ppl_forward": forward,
            "dev_ppl_backward": backward,
            "dev_ppl": (forward + backward) / 2,
        }

    def _dev_sentences(self) -> list[list[str]]:
        """At most `max_dev_sentences`, evenly spaced over the whole held-out file."""
        if getattr(self, "_dev_cache", None) is None:
            total = sum(1 for _ in read_sentences(self.dev_path))
            stride = max(1, -(-total // self.config.max_dev_sentences))
            self._dev_cache = [
                s for i, s in enumerate(read_sentences(self.dev_path)) if i % stride == 0
            ]
        return list(self._dev_cache)

    def save_checkpoint(self) -> None:
        """Write checkpoints/last.pt atomically (rank 0 only)."""
        self._barrier()
        if self.is_main:
            path = self.work / CHECKPOINT
            state = {
                "config": asdict(self.config),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(self.device)
                if self.device.type == "cuda"
                else None,
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "train_seconds": self.train_seconds,
            }
            save_checkpoint(state, path)
        self._barrier()

    def finish(self) -> dict[str, Any]:
        """Save the biLM (+ softmax and vocab), metrics plot, optional bilm-tf export."""
        summary: dict[str, Any] = {}
        if self.distributed:
            summary["rank_checksums"] = self._rank_checksums()
        if self.is_main:
            model_dir = self.work / "model"
            bilm = self.model.bilm
            bilm.eval()
            bilm.save(model_dir)
            write_safetensors(self.model.head.state_dict(), model_dir / "lm_head.safetensors")
            self.vocab.to_file(model_dir / "vocab.txt")
            final_eval = self.evaluate()
            summary.update(
                {
                    "options": bilm.options.to_dict(),
                    "n_parameters": bilm.options.n_parameters(),
                    "vocab_size": len(self.vocab),
                    "steps": self.step,
                    "tokens_seen": self.tokens_seen,
                    "train_seconds": round(self.train_seconds, 1),
                    "world_size": self.world,
                    **final_eval,
                }
            )
            write_text(model_dir / "pretrain.json", json.dumps(summary, indent=2) + "\n")
            if self.config.export_allennlp:
                bilm.to_allennlp(
                    self.work / "allennlp" / "options.json", self.work / "allennlp" / "weights.hdf5"
                )
            try:
                from .plot import plot_metrics

                plot_metrics(self.work / METRICS, self.work / "perplexity.png")
            except ImportError:
                logger.warning("matplotlib is not installed: no perplexity plot")
        self._barrier()
        return summary

    def _rank_checksums(self) -> list[float]:
        """Every rank's sum of all weights (float64), gathered on all ranks."""
        local = torch.tensor(
            [sum(p.detach().double().sum().item() for p in self.model.parameters())],
            dtype=torch.float64,
            device=self.device,
        )
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        torch.distributed.all_gather(gathered, local)
        return [g.item() for g in gathered]  # .item() moves each to the host


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines a killed run wrote after its last checkpoint.

    A line that is not a JSON record (the half-written last line of a killed run) is dropped
    with a warning naming the file and line.
    """
    if not path.exists():
        return
    kept = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n")):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("step", 0), int):
            logger.warning("%s, line %d: not a complete metrics record; dropped", path, number + 1)
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    write_text(path, "".join(line + "\n" for line in kept))


def pretrain(
    config: PretrainConfig,
    resume: bool = False,
    overwrite: bool = False,
    explicit: Optional[Collection[str]] = None,
) -> dict[str, Any]:
    """Run (or resume) a pretraining run; returns the summary written to model/pretrain.json.

    The run directory is locked for the whole run. A directory that already holds a run is
    refused unless `resume` (continue it) or `overwrite` (delete it and start again).
    """
    is_main = int(os.environ.get("RANK", "0")) == 0
    lock = RunDirectoryLock(Path(config.output)) if is_main else nullcontext()
    with lock:
        if is_main:
            prepare_run_directory(Path(config.output), resume, overwrite)
        trainer = Pretrainer(config, resume=resume, explicit=explicit)
        try:
            return trainer.train()
        finally:
            if trainer.distributed and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
