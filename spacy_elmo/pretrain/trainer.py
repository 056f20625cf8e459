"""The pretraining loop: train a biLM with forward and backward language-model losses.

The settings are `config.py`'s, the model and its loss `objective.py`'s.

Resumable bit for bit: a checkpoint holds the weights, optimizer, scheduler, RNG state and
the number of batches consumed; the batch stream is a pure function of (seed, corpus), so a
resumed run skips the consumed batches and continues exactly where the killed run was. A resume
may run elsewhere (another thread count, GPU or memory limit: `PLACEMENT`); it then computes the
same steps, but its floating-point sums may round differently.
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
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Collection, Iterator, NoReturn, Optional

import torch
from torch import nn

from ..bilm import BiLM, BiLMOptions, batch_to_ids
from ..bilm.batching import batches_by_padded_tokens
from ..bilm.lm_head import LMHead
from ..util import threads as cpu_threads
from ..util.files import write_text
from ..weights.sources import resolve_source
from ..weights.tensors import write_safetensors
from .checkpoint import load_checkpoint, save_checkpoint
from .config import (
    DEFAULT_MAX_STEPS,
    PretrainConfig,
    build_options,
    moved_settings,
    resumed_config,
    warmup_longer_than_run,
)
from .corpus import (
    SkippedLines,
    iter_batches,
    iter_input_files,
    pretokenized_splitter,
    read_sentences,
    spacy_sentence_splitter,
    write_tokenized,
)
from .distill import DistillationHeads, StaticVectors
from .objective import (
    MAX_LOG_FLOAT,
    LanguageModel,
    load_head,
    load_init_model,
    mean_loss,
    target_tensor,
)
from .objective import perplexity_of as _perplexity
from .presets import preset
from .rundir import RunDirectoryLock, prepare_run_directory
from .teacher import Teacher, TeacherHead
from .teacher_store import TeacherStore, build_store, wait_for_store
from .vocab import Vocab

logger = logging.getLogger("spacy_elmo.pretrain")

CHECKPOINT = "checkpoints/last.pt"
METRICS = "metrics.jsonl"
SKIPPED = "corpus/skipped.json"  # the input lines that were not text, by file
# Written when a run diverges (the step, loss, gradient norm, learning rate and the step of the
# checkpoint kept); removed by the next checkpoint. While it is there, a resumed run may change
# the settings that tame a divergence.
DIVERGED = "checkpoints/diverged.json"
DIVERGENCE_REMEDIES = ("learning_rate", "clip_norm", "warmup_steps")
# Where each part of a run happened (a resumed run may change them): model/pretrain.json's
# "ran_with" lists them by the step each part started at.
PLACEMENT = ("threads", "gpu_id", "max_memory_gb")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A mean NLL (nats a token) past this has a perplexity no float holds (exp overflows): counted
# as a divergence like NaN, as no model reaches it that has not blown up (uniform guessing over
# V words costs ln V, about 11 nats for 50,000).
MAX_LOSS = MAX_LOG_FLOAT


class TrainingDiverged(ValueError):
    """A non-finite loss, gradient, weight or held-out loss: the run stopped before writing it."""


# ---------------------------------------------------------------------- set-up
def prepare_corpus(config: PretrainConfig, work: Path) -> tuple[Path, Path]:
    """Tokenise the inputs once into work/corpus/{train,dev}.txt (skipped when present)."""
    train, dev = work / "corpus" / "train.txt", work / "corpus" / "dev.txt"
    if train.exists() and dev.exists():
        return train, dev
    splitter = (
        pretokenized_splitter
        if config.pretokenized
        else spacy_sentence_splitter(config.lang, config.pipeline)
    )
    files = iter_input_files(config.inputs)
    if not files:
        raise ValueError(f"no usable text files in {', '.join(config.inputs)}")
    skipped = SkippedLines()  # lines that are not text: warned about, counted in the summary
    limit = config.max_sentence_tokens
    if config.dev:
        dev_files = iter_input_files(config.dev)
        write_tokenized(files, train, splitter, limit, skipped=skipped)
        write_tokenized(dev_files, dev, splitter, limit, skipped=skipped)
    else:
        write_tokenized(files, train, splitter, limit, dev, config.dev_every, skipped=skipped)
    write_text(work / SKIPPED, json.dumps(skipped.to_dict(), indent=2) + "\n")
    return train, dev


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
        self.checkpoint_step: Optional[int] = None
        remedied: dict[str, tuple[Any, Any]] = {}
        moved: dict[str, tuple[Any, Any]] = {}
        if resume:
            path = self.work / CHECKPOINT
            checkpoint = load_checkpoint(path)
            saved, remedied = _remedies_after_divergence(
                checkpoint["config"], config, self.work / DIVERGED, explicit
            )
            config = resumed_config(saved, config, path, explicit)
            moved = moved_settings(saved, config)
            self.checkpoint_step = checkpoint["step"]
        elif config.max_steps is None:
            config = replace(config, max_steps=DEFAULT_MAX_STEPS)
        self.config = config
        self.threads = cpu_threads.use_threads(config.threads, "--threads")
        # Under torchrun each process of a machine takes its own GPU: gpu_id + its local rank.
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.distributed else 0
        gpu = config.gpu_id + local_rank
        self.device = torch.device(f"cuda:{gpu}" if config.gpu_id >= 0 else "cpu")
        if self.distributed and not torch.distributed.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend)
        self.is_main = self.rank == 0
        torch.manual_seed(config.seed)
        short_run = warmup_longer_than_run(config)
        if short_run is not None and self.is_main:
            logger.warning(short_run)

        if self.is_main:
            self.train_path, self.dev_path = prepare_corpus(config, self.work)
        self._barrier()
        self.train_path = self.work / "corpus" / "train.txt"
        self.dev_path = self.work / "corpus" / "dev.txt"
        if self.is_main and next(read_sentences(self.dev_path), None) is None:
            raise ValueError(f"the held-out file {self.dev_path} has no sentences")
        self.teacher_store = self._teacher_store() if config.teacher else None

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
        teacher_head = None
        if self.teacher_store is not None:
            teacher_head = TeacherHead(
                options.n_layers, options.projection_dim, self.teacher_store.dim
            )
        self.model = LanguageModel(bilm, head, config.dropout, distill, teacher_head)
        self.model.to(self.device)
        self.aux_sums = distill is not None or teacher_head is not None
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self.tokens_seen = 0
        self.train_seconds = 0.0
        if checkpoint is not None:
            self._restore(checkpoint)
            if remedied:
                self._set_learning_rate()
                if self.is_main:
                    logger.warning(
                        "resuming after a divergence from the checkpoint of step %d with %s",
                        self.step,
                        ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in remedied.items()),
                    )
            if moved and self.is_main:
                logger.warning(
                    "resuming at step %d with %s: where the run happens, not what it computes "
                    "(another thread count or device may round its sums differently)",
                    self.step,
                    ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in moved.items()),
                )
            if self.is_main:
                _truncate_metrics(self.work / METRICS, self.step)
        self.ran_with = _ran_with(checkpoint, self.step, self._placement())
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
        self.stop_signal: Optional[int] = None
        self.last_train_ppl: Optional[float] = None  # the last one logged
        self.checkpoint_ppl: Optional[float] = None  # the last one logged before the checkpoint

    def _placement(self) -> dict[str, Any]:
        """Where this part of the run happens: the PLACEMENT settings (threads as set)."""
        return {**{name: getattr(self.config, name) for name in PLACEMENT}, "threads": self.threads}

    def _teacher_store(self) -> TeacherStore:
        """The teacher's vectors of the training corpus: made (or finished) by rank 0 before
        training, then opened read-only by every rank."""
        config = self.config
        store = Path(config.teacher_store) if config.teacher_store else self.work / "teacher"
        if self.is_main:
            teacher = Teacher.load(config.teacher, config.teacher_layer)
            build_store(store, self.train_path, teacher, config.teacher_store_max_gb)
            del teacher
        else:
            wait_for_store(store)  # no collective: building may outlast a barrier's timeout
        self._barrier()
        return TeacherStore(store)

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

    def _set_learning_rate(self) -> None:
        """The scheduler's base rate and the current rate from `config` (a resumed run whose
        learning rate or warm-up changed after a divergence; the checkpoint holds the old)."""
        rate = self.config.learning_rate
        for group in self.optimizer.param_groups:
            group["initial_lr"] = rate
            group["lr"] = rate * self._lr_factor(self.scheduler.last_epoch)
        self.scheduler.base_lrs = [rate] * len(self.optimizer.param_groups)
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

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

    def _loss(
        self, sentences: list[list[str]], module: nn.Module, aux: bool = True
    ) -> torch.Tensor:
        """The sums of `LanguageModel` for a batch; `aux=False`: the language models' only
        (held-out text has no teacher vectors)."""
        char_ids = batch_to_ids(sentences).to(self.device)
        targets = target_tensor(sentences, self.vocab).to(self.device)
        rows = teacher_targets = None
        if aux and self.static_vectors is not None:
            rows = self.static_vectors.target_rows(sentences).to(self.device)
        if aux and self.teacher_store is not None:
            teacher_targets = self.teacher_store.targets(sentences).to(self.device)
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.config.mixed_precision
        ):
            return module(char_ids, targets, rows, teacher_targets).float()

    # ------------------------------------------------------------------ loop
    def train(self, progress: bool = True) -> dict[str, Any]:
        """Train to `max_steps`; `progress`: the main rank draws a progress bar."""
        from tqdm import tqdm

        config = self.config
        # Ctrl-C and SIGTERM (what torchrun and job schedulers send) end the step, write a
        # checkpoint and return; the command then exits with 130 or 143.
        previous = {number: signal.signal(number, self._request_stop) for number in STOP_SIGNALS}
        bar = tqdm(
            total=config.max_steps,
            initial=self.step,
            disable=not (self.is_main and progress),
            unit="step",
        )
        window_tokens, window_start = 0, time.perf_counter()
        window_nll = torch.zeros(10 if self.aux_sums else 4)
        epoch = 0
        try:
            batches = self._my_batches()
            while self.step < config.max_steps and not self._should_stop():
                start = time.perf_counter()
                epoch, sentences = next(batches)
                self.model.train()
                sums = self._loss(sentences, self.train_module)
                loss = mean_loss(sums, config.vectors_weight, config.teacher_weight)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    self.model.parameters(), config.clip_norm
                )
                self._check_step(loss, grad_norm)  # before the step: the weights stay finite
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
                    ppl = _perplexity(
                        (window_nll[0] + window_nll[2]).item(),
                        (window_nll[1] + window_nll[3]).item(),
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
                    if self.static_vectors is not None:
                        record["token_cosine"] = (window_nll[4] / window_nll[5].clamp(min=1)).item()
                        record["context_cosine"] = (
                            window_nll[6] / window_nll[7].clamp(min=1)
                        ).item()
                    if self.teacher_store is not None:
                        record["teacher_cosine"] = (
                            window_nll[8] / window_nll[9].clamp(min=1)
                        ).item()
                    bar.set_postfix(
                        loss=f"{math.log(ppl):.3f}",
                        ppl=f"{ppl:.1f}",
                        tok_s=f"{record['tokens_per_s']:.0f}",
                    )
                    self._log(record)
                    self.last_train_ppl = ppl
                    window_tokens, window_start = 0, time.perf_counter()
                    window_nll = torch.zeros_like(window_nll)
                if self.step % config.eval_every == 0 or self.step == config.max_steps:
                    held_out = self.evaluate()
                    self._log({"step": self.step, **held_out})
                    self._check_held_out(held_out)
                if self.step % config.checkpoint_every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
            for number, handler in previous.items():
                signal.signal(number, handler)
        self.save_checkpoint()
        if self.stop_requested:
            if self.is_main:
                logger.warning(
                    "interrupted: checkpoint written at step %d; resume the run to continue",
                    self.step,
                )
            return {"interrupted": True, "step": self.step, "signal": self.stop_signal}
        summary = self.finish()
        return summary

    def _request_stop(self, signum, frame) -> None:  # noqa: ARG002
        self.stop_requested = True
        self.stop_signal = signum

    def _should_stop(self) -> bool:
        if not self.distributed:
            return self.stop_requested
        # The signal's number, 0 for none: every rank stops when one was signalled.
        flag = torch.tensor([float(self.stop_signal or 0)], device=self.device)
        # On the device: NCCL reduces CUDA tensors only.
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        self.stop_signal = int(flag.item()) or None
        self.stop_requested = self.stop_signal is not None
        return self.stop_requested

    # ------------------------------------------------------------------ divergence
    def _any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank: every rank gets the same answer, so that all of
        them stop together."""
        if not self.distributed:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return value.item() > 0

    def _check_step(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """TrainingDiverged when the loss or the gradient norm is not finite on any rank
        (called before the optimizer's step, which would write them into the weights)."""
        values = torch.stack([loss.detach().float(), grad_norm.detach().float().to(loss.device)])
        loss_value, norm_value = values.tolist()
        bad = not (math.isfinite(loss_value) and math.isfinite(norm_value))
        if self._any_rank(bad or loss_value > MAX_LOSS):
            self._diverged(
                f"the loss is {loss_value:.6g} (nats a token) and the gradient norm "
                f"{norm_value:.6g}",
                self.step + 1,
            )

    def _check_held_out(self, held_out: dict[str, float]) -> None:
        """TrainingDiverged when the held-out perplexity (rank 0's) is not finite."""
        bad = not all(math.isfinite(value) for value in held_out.values())
        if self._any_rank(bad):
            self._diverged(f"the held-out perplexity is {held_out.get('dev_ppl', 'not finite')}")

    def _check_weights(self) -> None:
        """TrainingDiverged when a weight or an optimizer moment is not finite."""
        bad = None
        for name, weight in self.model.named_parameters():
            if not bool(torch.isfinite(weight).all()):
                bad = f"weight '{name}' holds NaN or inf"
                break
            for key, moment in self.optimizer.state.get(weight, {}).items():
                finite = not moment.is_floating_point() or bool(torch.isfinite(moment).all())
                if not finite:
                    bad = f"the optimizer's '{key}' of weight '{name}' holds NaN or inf"
                    break
            if bad:
                break
        if self._any_rank(bad is not None):
            self._diverged(bad or "a weight on another rank holds NaN or inf")

    def _diverged(self, what: str, step: Optional[int] = None) -> NoReturn:
        """Stop the run: record the divergence beside the checkpoint, which is kept as it was,
        and raise TrainingDiverged saying how to continue."""
        step = self.step if step is None else step
        rate = self.scheduler.get_last_lr()[0]
        kept = self.checkpoint_step
        if self.is_main:
            record = {"step": step, "what": what, "learning_rate": rate, "checkpoint_step": kept}
            write_text(self.work / DIVERGED, json.dumps(record) + "\n")
        rates = (self.config.learning_rate / 10, DEFAULT_LEARNING_RATE)
        lower = f"{min(rates):.3g}"
        if kept is None:
            advice = (
                f"no checkpoint was written before it (checkpoint_every is "
                f"{self.config.checkpoint_every}): start the run again (overwrite it) with a lower "
                f"learning_rate (e.g. {lower}) or more warmup_steps"
            )
        else:
            ppl = self.checkpoint_ppl
            advice = (
                f"the checkpoint of step {kept} ({self.work / CHECKPOINT}"
                f"{f', training perplexity {ppl:.4g} when written' if ppl is not None else ''}) "
                f"is kept: resume the run from it with a lower learning_rate (e.g. {lower}); after "
                f"a divergence a resumed run may change {', '.join(DIVERGENCE_REMEDIES)} (with the "
                f"same settings it replays the same batches and diverges again)"
            )
        raise TrainingDiverged(
            f"training diverged at step {step}: {what} (learning rate {rate:.3g}); no model was "
            f"written; {advice}"
        )

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
            sums += self._loss(batch, self.model, aux=False)[:4].cpu()
        if sums[1].item() == 0:  # not a perplexity of 1.0
            raise ValueError(f"the held-out file {self.dev_path} has no sentences")
        forward = _perplexity(sums[0].item(), sums[1].item())
        backward = _perplexity(sums[2].item(), sums[3].item())
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
        """Write checkpoints/last.pt atomically (rank 0 only); never from non-finite weights,
        which leave the last checkpoint as it was (TrainingDiverged)."""
        self._check_weights()
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
                "ran_with": self.ran_with,
            }
            save_checkpoint(state, path)
            (self.work / DIVERGED).unlink(missing_ok=True)  # this checkpoint has the settings
        self.checkpoint_step, self.checkpoint_ppl = self.step, self.last_train_ppl
        self._barrier()

    def finish(self) -> dict[str, Any]:
        """Save the biLM (+ softmax and vocab), metrics plot, optional bilm-tf export."""
        summary: dict[str, Any] = {}
        if self.distributed:
            summary["rank_checksums"] = self._rank_checksums()
        # Checked before anything is written: no model from non-finite weights.
        self._check_weights()
        final_eval = self.evaluate()
        self._check_held_out(final_eval)
        if self.is_main and final_eval["dev_ppl"] > 2 * len(self.vocab):
            logger.warning(
                "the held-out perplexity %.4g is over twice the vocabulary's size (%d): far worse "
                "than guessing every word equally likely; the run has probably diverged "
                "(learning rate %g)",
                final_eval["dev_ppl"],
                len(self.vocab),
                self.config.learning_rate,
            )
        if self.is_main:
            model_dir = self.work / "model"
            bilm = self.model.bilm
            bilm.eval()
            bilm.save(model_dir)
            write_safetensors(self.model.head.state_dict(), model_dir / "lm_head.safetensors")
            self.vocab.to_file(model_dir / "vocab.txt")
            summary.update(
                {
                    "options": bilm.options.to_dict(),
                    "n_parameters": bilm.options.n_parameters(),
                    "vocab_size": len(self.vocab),
                    "steps": self.step,
                    "tokens_seen": self.tokens_seen,
                    "train_seconds": round(self.train_seconds, 1),
                    "world_size": self.world,
                    "ran_with": self.ran_with,
                    **final_eval,
                    **_read_skipped(self.work / SKIPPED),
                }
            )
            write_text(model_dir / "pretrain.json", json.dumps(summary, indent=2) + "\n")
            if self.config.export_allennlp:
                bilm.to_allennlp(
                    self.work / "allennlp" / "options.json", self.work / "allennlp" / "weights.hdf5"
                )
            try:
                from .plot import plot_metrics

                title = f"biLM pretraining: {self.work.name}"
                if self.config.init_from:
                    title += f", continued from {Path(self.config.init_from).name}"
                plot_metrics(self.work / METRICS, self.work / "perplexity.png", title=title)
            except ImportError:
                from ..util.extras import install_hint

                hint = install_hint("pretrain", "matplotlib")
                logger.warning("matplotlib is not installed: no perplexity plot; %s", hint)
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


DEFAULT_LEARNING_RATE = next(f.default for f in fields(PretrainConfig) if f.name == "learning_rate")


def _read_skipped(path: Path) -> dict[str, Any]:
    """The count of input lines skipped as not text (corpus/skipped.json), if recorded."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or not isinstance(record.get("skipped_lines"), int):
        return {}
    return {"skipped_lines": record["skipped_lines"]}


def _remedies_after_divergence(
    saved: dict[str, Any],
    given: PretrainConfig,
    marker: Path,
    explicit: Optional[Collection[str]],
) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """The checkpoint's settings with the DIVERGENCE_REMEDIES given for this resume, when the
    run diverged after that checkpoint (`marker` exists); and {setting: (old, new)} changed."""
    if not marker.exists():
        return saved, {}
    changed = {}
    for name in DIVERGENCE_REMEDIES:
        if explicit is not None and name not in explicit:
            continue
        old, new = saved.get(name), getattr(given, name)
        if old != new:
            changed[name] = (old, new)
    return {**saved, **{name: new for name, (_, new) in changed.items()}}, changed


def _ran_with(
    checkpoint: Optional[dict[str, Any]], step: int, placement: dict[str, Any]
) -> list[dict[str, Any]]:
    """The run's parts: [{"step": where a part starts, **its PLACEMENT}], from the checkpoint's
    record (a checkpoint without one: its settings from step 0) with this part added when it
    runs elsewhere than the last one did."""
    if checkpoint is None:
        return [{"step": 0, **placement}]
    record = checkpoint.get("ran_with")
    plain = (int, float, type(None))
    if not (
        isinstance(record, list)
        and record
        and all(
            isinstance(part, dict)
            and isinstance(part.get("step"), int)
            and all(isinstance(k, str) and isinstance(v, plain) for k, v in part.items())
            for part in record
        )
    ):
        saved = checkpoint["config"]
        record = [{"step": 0, **{name: saved.get(name) for name in PLACEMENT}}]
    last = {k: v for k, v in record[-1].items() if k != "step"}
    if last == placement:
        return list(record)
    if record[-1]["step"] == step:  # that part ran no step
        return [*record[:-1], {"step": step, **placement}]
    return [*record, {"step": step, **placement}]


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


def check_sources(config: PretrainConfig) -> None:
    """Raise ValueError / FileNotFoundError for an input, held-out text, biLM to adapt or
    static-vectors pipeline that is not there, so that nothing is written for a run that
    cannot start."""
    import spacy

    if config.options is None:
        preset(config.preset)  # an unknown name is refused here
    for setting in ("inputs", "dev"):
        for item in getattr(config, setting):
            if not Path(item).exists():
                raise FileNotFoundError(f"pretraining {setting} {item} does not exist")
    if config.init_from:
        resolve_source(config.init_from)
    if config.pipeline and not (
        spacy.util.is_package(config.pipeline) or Path(config.pipeline).is_dir()
    ):
        raise ValueError(
            f"pipeline {config.pipeline!r}: not an installed spaCy pipeline or a pipeline directory"
        )
    if not config.pretokenized and config.pipeline is None:
        try:
            spacy.util.get_lang_class(config.lang)
        except ImportError as err:
            raise ValueError(f"lang {config.lang!r}: {str(err).splitlines()[0]}") from None
    if (
        config.teacher
        and not Path(config.teacher).exists()
        and not spacy.util.is_package(config.teacher)
    ):
        raise ValueError(
            f"teacher {config.teacher}: not a Hugging Face model folder, a pipeline directory or "
            f"an installed spaCy pipeline"
        )
    vectors = config.static_vectors
    if vectors and not (spacy.util.is_package(vectors) or Path(vectors).is_dir()):
        raise ValueError(
            f"static_vectors {vectors}: not an installed spaCy pipeline or a pipeline directory"
        )


def pretrain(
    config: PretrainConfig,
    resume: bool = False,
    overwrite: bool = False,
    explicit: Optional[Collection[str]] = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) a pretraining run; returns the summary written to model/pretrain.json
    (`progress`: a progress bar on standard error).

    The run directory is locked for the whole run. A directory that already holds a run is
    refused unless `resume` (continue it) or `overwrite` (delete it and start again).
    """
    is_main = int(os.environ.get("RANK", "0")) == 0
    if not resume:
        check_sources(config)  # before the run directory or anything in it is made
    lock = RunDirectoryLock(Path(config.output)) if is_main else nullcontext()
    with lock:
        if is_main:
            prepare_run_directory(Path(config.output), resume, overwrite)
        trainer = Pretrainer(config, resume=resume, explicit=explicit)
        try:
            return trainer.train(progress)
        finally:
            if trainer.distributed and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
