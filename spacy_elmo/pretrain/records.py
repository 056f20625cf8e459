"""What a run records: metrics.jsonl, where each part of it ran ("ran_with"), the lines that
say its budget, and a finished run's outputs (model/, the bilm-tf export, the plot)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import torch

from ..util.files import write_text
from ..weights.tensors import write_safetensors
from .config import PLACEMENT, PretrainConfig
from .objective import LanguageModel, perplexity_of
from .vocab import Vocab

logger = logging.getLogger("spacy_elmo.pretrain")

METRICS = "metrics.jsonl"


class TrainWindow:
    """The training steps since the last metrics line: their tokens, summed losses and time."""

    def __init__(self, n_sums: int) -> None:
        self.tokens, self.start = 0, time.perf_counter()
        self.sums = torch.zeros(n_sums)

    def add(self, tokens: int, sums: torch.Tensor) -> None:
        self.tokens += tokens
        self.sums += sums.detach().cpu()

    def record(
        self, step: int, epoch: int, tokens: int, lr: float, train_seconds: float
    ) -> dict[str, Any]:
        """The window's metrics line at `step` (`tokens` seen in all); the window restarts."""
        elapsed = time.perf_counter() - self.start
        window = self.sums
        ppl = perplexity_of((window[0] + window[2]).item(), (window[1] + window[3]).item())
        record = {
            "step": step,
            "epoch": epoch,
            "tokens": tokens,
            "train_ppl": ppl,
            "lr": lr,
            "tokens_per_s": self.tokens / max(elapsed, 1e-9),
            "train_seconds": train_seconds,
        }
        if window.shape[0] > 4:
            record["token_cosine"] = (window[4] / window[5].clamp(min=1)).item()
            record["context_cosine"] = (window[6] / window[7].clamp(min=1)).item()
        self.tokens, self.start = 0, time.perf_counter()
        self.sums = torch.zeros_like(window)
        return record


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the metric lines after `step` and, with a warning, any that is not a JSON record
    (the half-written last line of a killed run)."""
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


def ran_with(
    checkpoint: Optional[dict[str, Any]], step: int, placement: dict[str, Any]
) -> list[dict[str, Any]]:
    """[{"step": where a part starts, **its PLACEMENT}]: the checkpoint's parts (without a
    record, its settings from step 0), this part added when it runs elsewhere."""
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
    if {k: v for k, v in record[-1].items() if k != "step"} == placement:
        return list(record)
    kept = record[:-1] if record[-1]["step"] == step else record  # a part that ran no step goes
    return [*kept, {"step": step, **placement}]


def read_skipped(path: Path) -> dict[str, Any]:
    """The count of input lines skipped as not text (corpus/skipped.json), if recorded."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return {"skipped_lines": int(record["skipped_lines"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_outputs(
    work: Path, config: PretrainConfig, model: LanguageModel, vocab: Vocab, summary: dict
) -> None:
    """model/ (biLM, softmax, vocabulary, `summary` as pretrain.json), the bilm-tf export if
    asked for, and the perplexity plot."""
    model_dir = work / "model"
    bilm = model.bilm
    bilm.eval()
    bilm.save(model_dir)
    write_safetensors(model.head.state_dict(), model_dir / "lm_head.safetensors")
    vocab.to_file(model_dir / "vocab.txt")
    write_text(model_dir / "pretrain.json", json.dumps(summary, indent=2) + "\n")
    if config.export_allennlp:
        bilm.to_allennlp(work / "allennlp" / "options.json", work / "allennlp" / "weights.hdf5")
    try:
        from .plot import plot_metrics

        title = f"biLM pretraining: {work.name}"
        if config.init_from:
            title += f", continued from {Path(config.init_from).name}"
        plot_metrics(work / METRICS, work / "perplexity.png", title=title)
    except ImportError:
        from ..util.extras import install_hint

        hint = install_hint("pretrain", "matplotlib")
        logger.warning("matplotlib is not installed: no perplexity plot; %s", hint)


# The steps timed for the estimate, after the first (which warms up and is left out).
ESTIMATE_AFTER = 5


def duration(seconds: float) -> str:
    """`seconds` as a person reads a budget: "40 s", "25 min", "14.2 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def token_count(tokens: int) -> str:
    """`tokens` as "20.5M" from a million on, else with thousands separators."""
    return f"{tokens / 1e6:.1f}M" if tokens >= 1_000_000 else f"{tokens:,}"


def budget_line(config: PretrainConfig, step: int, threads: int, device: str) -> str:
    """What the run is about to do, said before its first step: the steps, tokens and where."""
    steps = config.max_steps - step
    where = f"{threads} CPU thread{'s' * (threads != 1)}" if device == "cpu" else device
    start = f" (steps {step + 1:,} to {config.max_steps:,})" if step else ""
    return (
        f"training {steps:,} steps{start} of up to {config.batch_tokens:,} tokens each "
        f"(up to {token_count(steps * config.batch_tokens)} tokens) on {where}; "
        f"an estimate of the time follows after {ESTIMATE_AFTER + 1} steps"
    )


def estimate_line(config: PretrainConfig, step: int, step_seconds: list[float]) -> str:
    """How long the rest of the run takes at the mean time of the steps timed, the first left
    out (it warms up)."""
    timed = step_seconds[1:]
    seconds_per_step = sum(timed) / len(timed)
    left = config.max_steps - step
    every = config.eval_every
    evaluations = config.max_steps // every - step // every + (config.max_steps % every != 0)
    return (
        f"estimate: {duration(left * seconds_per_step)} for the {left:,} steps left at "
        f"{seconds_per_step:.2f} s a step (the mean of {len(timed)} steps), plus "
        f"{evaluations} held-out evaluation{'s' * (evaluations != 1)}; Ctrl-C writes a "
        "checkpoint and --resume continues"
    )
