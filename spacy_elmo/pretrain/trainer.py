"""The pretraining loop, resumable bit for bit (the checkpoint holds all training state and the
batch stream is a pure function of seed and corpus); under `torchrun`, DistributedDataParallel
over the run's processes (`Ranks`: without torchrun, rank 0 of 1)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from itertools import islice
from pathlib import Path
from typing import Any, Collection, Optional

import torch
from torch import nn

from ..bilm import batch_to_ids
from ..util import signals
from ..util import threads as cpu_threads
from ..util.files import write_text
from .checkpoint import (
    CHECKPOINT,
    load_checkpoint,
    locked_run_directory,
    prepare_run_directory,
    save_checkpoint,
)
from .config import (
    DEFAULT_MAX_STEPS,
    DIVERGENCE_REMEDIES,
    PLACEMENT,
    PretrainConfig,
    check_sources,
    resumed_config,
    warmup_longer_than_run,
)
from .corpus import DEV, SKIPPED, TRAIN, iter_batches, prepare_corpus, spread_sample
from .divergence import (
    DIVERGED,
    TrainingDiverged,
    held_out_problem,
    step_problem,
    warn_if_worse_than_guessing,
    weights_problem,
)
from .evaluate import held_out_perplexity
from .objective import build_language_model, mean_loss, target_tensor
from .records import (
    ESTIMATE_AFTER,
    METRICS,
    TrainWindow,
    append_metrics,
    budget_line,
    estimate_line,
    ran_with,
    read_skipped,
    truncate_metrics,
    write_outputs,
)

logger = logging.getLogger("spacy_elmo.pretrain")


class Ranks:
    """This process's rank among the run's `world` processes, from torchrun's environment."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.distributed = self.world > 1
        self.rank = int(os.environ.get("RANK", "0"))
        self.is_main = self.rank == 0
        # Under torchrun each process of a machine takes its own GPU: gpu_id + its local rank.
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.distributed else 0
        self.device = torch.device("cpu")

    def start(self, device: torch.device) -> None:
        """Join the process group (once), reducing on `device` (NCCL: CUDA tensors only)."""
        self.device = device
        if self.distributed and not torch.distributed.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def max(self, value: float) -> float:
        """The largest `value` of all ranks (the same answer on all, so that all stop)."""
        if not self.distributed:
            return value
        reduced = torch.tensor([float(value)], device=self.device)
        torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.MAX)
        return reduced.item()

    def checksums(self, model: nn.Module) -> list[float]:
        """Every rank's sum of all weights of `model` (float64), gathered on all ranks."""
        local = torch.tensor(
            [sum(p.detach().double().sum().item() for p in model.parameters())],
            dtype=torch.float64,
            device=self.device,
        )
        gathered = [torch.zeros_like(local) for _ in range(self.world)]
        torch.distributed.all_gather(gathered, local)
        return [g.item() for g in gathered]  # .item() moves each to the host


class Pretrainer:
    """One pretraining run in `config.output`, new or resumed from its checkpoint (`resume`);
    call it with the directory locked (`pretrain`)."""

    def __init__(
        self,
        config: PretrainConfig,
        resume: bool = False,
        explicit: Optional[Collection[str]] = None,
    ) -> None:
        self.work = Path(config.output)
        self.checkpoint_path = self.work / CHECKPOINT
        self.ranks = ranks = Ranks()
        checkpoint = load_checkpoint(self.checkpoint_path) if resume else None
        diverged = checkpoint is not None and (self.work / DIVERGED).exists()
        if checkpoint is not None:
            config, changed = resumed_config(
                checkpoint["config"], config, self.checkpoint_path, explicit, diverged
            )
            if ranks.is_main:
                log_resume(checkpoint["step"], changed)
        elif config.max_steps is None:
            config = replace(config, max_steps=DEFAULT_MAX_STEPS)
        self.config = config
        self.threads = cpu_threads.use_threads(config.threads, "--threads")
        gpu = config.gpu_id + ranks.local_rank
        self.device = torch.device(f"cuda:{gpu}" if config.gpu_id >= 0 else "cpu")
        ranks.start(self.device)
        torch.manual_seed(config.seed)
        dev_path = self.work / DEV
        self.dev_sentences: list[list[str]] = []  # the main rank evaluates
        if ranks.is_main:
            short_run = warmup_longer_than_run(config)
            if short_run is not None:
                logger.warning(short_run)
            prepare_corpus(config, self.work)
            # at most `max_dev_sentences`, evenly spaced over the held-out file, sorted by length
            self.dev_sentences = sorted(spread_sample(dev_path, config.max_dev_sentences), key=len)
            if not self.dev_sentences:
                raise ValueError(f"the held-out file {dev_path} has no sentences")
        ranks.barrier()  # the corpus cache is there for every rank

        self.model, self.vocab, self.static_vectors = build_language_model(
            config, self.work, checkpoint, self.device, ranks.is_main
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = self.tokens_seen = 0
        self.train_seconds = 0.0
        self.checkpoint_step: Optional[int] = None
        if checkpoint is not None:
            self._restore(checkpoint)
            self.step = self.checkpoint_step = checkpoint["step"]
            self.tokens_seen = checkpoint["tokens_seen"]
            self.train_seconds = float(checkpoint["train_seconds"])
            if diverged:  # the rates of the remedies given, if any
                self._set_learning_rate()
            if ranks.is_main:
                truncate_metrics(self.work / METRICS, self.step)
        placement = {name: getattr(config, name) for name in PLACEMENT}
        self.ran_with = ran_with(checkpoint, self.step, {**placement, "threads": self.threads})
        self.train_module: nn.Module = self.model
        if ranks.distributed:
            # The adaptive softmax leaves the tail clusters without a target in a batch unused:
            # their gradients differ in presence between ranks.
            self.train_module = nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=True,
            )
        self.stop_signal: Optional[int] = None
        self.last_train_ppl: Optional[float] = None  # the last one logged
        self.checkpoint_ppl: Optional[float] = None  # the last one logged before the checkpoint

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        """The weights, the optimizer's, scheduler's and random number generators' state that
        `save_checkpoint` wrote; ValueError when they do not fit this run's model."""
        try:
            self.model.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.scheduler.load_state_dict(checkpoint["scheduler"])
            torch.set_rng_state(checkpoint["torch_rng"])
            if self.device.type == "cuda" and checkpoint.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(checkpoint["cuda_rng"], self.device)
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"checkpoint {self.checkpoint_path} does not fit this run's model: "
                f"{str(err).splitlines()[0] if str(err) else err!r}"
            ) from None

    def _set_learning_rate(self) -> None:
        """The scheduler's rates from `config` (a resume that changed them after a divergence)."""
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

    # ------------------------------------------------------------------ batches
    def _loss(self, sentences: list[list[str]]) -> torch.Tensor:
        """`LanguageModel`'s sums for a training batch."""
        char_ids = batch_to_ids(sentences).to(self.device)
        targets = target_tensor(sentences, self.vocab).to(self.device)
        rows = None
        if self.static_vectors is not None:
            rows = self.static_vectors.target_rows(sentences).to(self.device)
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.config.mixed_precision
        ):
            return self.train_module(char_ids, targets, rows).float()

    # ------------------------------------------------------------------ loop
    def train(self, progress: bool = True) -> dict[str, Any]:
        """Train to `max_steps`; `progress`: the main rank draws a progress bar."""
        from tqdm import tqdm

        config = self.config
        bar = tqdm(
            total=config.max_steps,
            initial=self.step,
            disable=not (self.ranks.is_main and progress),
            unit="step",
        )
        window = TrainWindow(8 if self.static_vectors is not None else 4)
        self._say(bar, budget_line(config, self.step, self.threads, str(self.device)))
        # Under the command (util/signals), Ctrl-C, SIGTERM (what torchrun and job schedulers
        # send) and SIGHUP (a dropped ssh session) end the step on every rank, then a checkpoint
        # is written; the command exits with 128 + the signal's number.
        with signals.deferred():
            try:
                self._train_steps(bar, window)
            finally:
                bar.close()
            self.save_checkpoint()
            if self.stop_signal is not None:
                signals.drop_pending()  # acted on: the run ends here, after its checkpoint
        if self.stop_signal is not None:
            if self.ranks.is_main:
                logger.warning(
                    "interrupted: checkpoint written at step %d; resume the run to continue",
                    self.step,
                )
            return {"interrupted": True, "step": self.step, "signal": self.stop_signal}
        return self.finish()

    def _train_steps(self, bar, window: TrainWindow) -> None:
        """Steps until `max_steps` or a stop signal on any rank."""
        config = self.config
        step_seconds: list[float] = []  # for the estimate of the time left
        world = self.ranks.world  # this rank's batches of the stream, after those consumed
        stream = iter_batches(self.work / TRAIN, config.seed, config.batch_tokens)
        batches = islice(stream, self.step * world + self.ranks.rank, None, world)
        while self.step < config.max_steps:
            # a stop signal on any rank: all stop at the same step
            self.stop_signal = int(self.ranks.max(signals.pending() or 0)) or None
            if self.stop_signal is not None:
                break
            start = time.perf_counter()
            epoch, sentences = next(batches)
            self.model.train()
            sums = self._loss(sentences)
            loss = mean_loss(sums, config.vectors_weight)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
            # before the step: the weights stay finite
            self._check(step_problem(loss, grad_norm), self.step + 1)
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            n_tokens = sum(len(s) for s in sentences) * world
            self.tokens_seen += n_tokens
            window.add(n_tokens, sums)
            step_seconds.append(time.perf_counter() - start)
            self.train_seconds += step_seconds[-1]
            bar.update(1)
            if len(step_seconds) == ESTIMATE_AFTER + 1 and self.step < config.max_steps:
                self._say(bar, estimate_line(config, self.step, step_seconds))
            if self.step % config.log_every == 0 or self.step == config.max_steps:
                record = window.record(
                    self.step,
                    epoch,
                    self.tokens_seen,
                    self.scheduler.get_last_lr()[0],
                    self.train_seconds,
                )
                ppl = record["train_ppl"]
                bar.set_postfix(
                    loss=f"{math.log(ppl):.3f}",
                    ppl=f"{ppl:.1f}",
                    tok_s=f"{record['tokens_per_s']:.0f}",
                )
                self._log(record)
                self.last_train_ppl = ppl
            if self.step % config.eval_every == 0 or self.step == config.max_steps:
                held_out = self.evaluate()
                self._log({"step": self.step, **held_out})
                self._check(held_out_problem(held_out))
            if self.step % config.checkpoint_every == 0:
                self.save_checkpoint()

    def _say(self, bar, line: str) -> None:
        """Log `line` on the main rank without tearing the progress bar."""
        if self.ranks.is_main:
            bar.clear()
            logger.info(line)
            bar.refresh()

    def _check(self, problem: Optional[str], step: Optional[int] = None) -> None:
        """TrainingDiverged, recorded in DIVERGED beside the checkpoint, when `problem` (a value
        that is not finite, in words) holds on any rank; `step`: where (else the current step).
        The message says how to go on from the last checkpoint, if any."""
        if not self.ranks.max(problem is not None):
            return
        what = problem or "a value on another rank is not finite"
        step = self.step if step is None else step
        rate, kept = self.scheduler.get_last_lr()[0], self.checkpoint_step
        if self.ranks.is_main:
            entry = {"step": step, "what": what, "learning_rate": rate, "checkpoint_step": kept}
            write_text(self.work / DIVERGED, json.dumps(entry) + "\n")
        lower = f"{min(self.config.learning_rate / 10, PretrainConfig.learning_rate):.3g}"
        if kept is None:
            advice = (
                f"no checkpoint was written before it (checkpoint_every is "
                f"{self.config.checkpoint_every}): start the run again (overwrite it) with a "
                f"lower learning_rate (e.g. {lower}) or more warmup_steps"
            )
        else:
            ppl = self.checkpoint_ppl
            written = "" if ppl is None else f", training perplexity {ppl:.4g} when written"
            advice = (
                f"the checkpoint of step {kept} ({self.checkpoint_path}{written}) is kept: resume "
                f"the run from it with a lower learning_rate (e.g. {lower}); after a divergence "
                f"a resumed run may change {', '.join(DIVERGENCE_REMEDIES)} (with the same "
                f"settings it replays the same batches and diverges again)"
            )
        raise TrainingDiverged(
            f"training diverged at step {step}: {what} (learning rate {rate:.3g}); no model was "
            f"written; {advice}"
        )

    def _log(self, record: dict[str, Any]) -> None:
        if self.ranks.is_main:
            append_metrics(self.work / METRICS, record)

    def evaluate(self) -> dict[str, float]:
        """Held-out perplexity of the forward and backward LMs, and their average."""
        if not self.ranks.is_main:
            return {}
        config = self.config
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=config.mixed_precision):
            result = held_out_perplexity(
                self.model, self.dev_sentences, self.vocab, config.batch_tokens
            )
        return {f"dev_{key}": result[key] for key in ("ppl_forward", "ppl_backward", "ppl")}

    def save_checkpoint(self) -> None:
        """Write checkpoints/last.pt atomically (rank 0); TrainingDiverged for weights that
        are not finite, which leave the last checkpoint as it was."""
        self._check(weights_problem(self.model, self.optimizer))
        self.ranks.barrier()
        if self.ranks.is_main:
            cuda = self.device.type == "cuda"
            state = {
                "config": asdict(self.config),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(self.device) if cuda else None,
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "train_seconds": self.train_seconds,
                "ran_with": self.ran_with,
            }
            save_checkpoint(state, self.checkpoint_path)
            (self.work / DIVERGED).unlink(missing_ok=True)  # this checkpoint has the settings
        self.checkpoint_step, self.checkpoint_ppl = self.step, self.last_train_ppl
        self.ranks.barrier()

    def finish(self) -> dict[str, Any]:
        """Save the biLM (+ softmax and vocab), metrics plot, optional bilm-tf export."""
        summary: dict[str, Any] = {}
        if self.ranks.distributed:
            summary["rank_checksums"] = self.ranks.checksums(self.model)
        final_eval = self.evaluate()
        self._check(held_out_problem(final_eval))
        if self.ranks.is_main:
            warn_if_worse_than_guessing(final_eval["dev_ppl"], len(self.vocab), self.config)
            bilm = self.model.bilm
            summary.update(
                {
                    "options": bilm.options.to_dict(),
                    "n_parameters": bilm.options.n_parameters(),
                    "vocab_size": len(self.vocab),
                    "steps": self.step,
                    "tokens_seen": self.tokens_seen,
                    "train_seconds": round(self.train_seconds, 1),
                    "world_size": self.ranks.world,
                    "ran_with": self.ran_with,
                    **final_eval,
                    **read_skipped(self.work / SKIPPED),
                }
            )
            write_outputs(self.work, self.config, self.model, self.vocab, summary)
        self.ranks.barrier()
        return summary


def log_resume(step: int, changed: dict[str, tuple[Any, Any]]) -> None:
    """A warning for each kind of setting that a resume at `step` changed ({setting: (old,
    new)}): the remedies after a divergence, and where the run happens."""
    remedied = {k: v for k, v in changed.items() if k in DIVERGENCE_REMEDIES}
    moved = {k: v for k, v in changed.items() if k not in DIVERGENCE_REMEDIES}
    if remedied:
        logger.warning(
            "resuming after a divergence from the checkpoint of step %d with %s",
            step,
            _changes(remedied),
        )
    if moved:
        logger.warning(
            "resuming at step %d with %s: where the run happens, not what it computes "
            "(another thread count or device may round its sums differently)",
            step,
            _changes(moved),
        )


def _changes(changed: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())


def pretrain(
    config: PretrainConfig,
    resume: bool = False,
    overwrite: bool = False,
    explicit: Optional[Collection[str]] = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run or resume a pretraining run in its locked directory; the summary written to
    model/pretrain.json. A directory holding a run needs `resume` or `overwrite`."""
    is_main = Ranks().is_main
    if not resume:
        check_sources(config)  # before the run directory or anything in it is made
    lock = locked_run_directory(Path(config.output)) if is_main else nullcontext()
    with lock:
        if is_main:
            prepare_run_directory(Path(config.output), resume, overwrite)
        trainer = Pretrainer(config, resume=resume, explicit=explicit)
        try:
            return trainer.train(progress)
        finally:
            if trainer.ranks.distributed and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
