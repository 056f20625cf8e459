"""What a resumed run starts from: its checkpoint, the settings it continues with, and the
lines that say what this resume changed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Optional

from .checkpoint import CHECKPOINT, load_checkpoint
from .config import PretrainConfig, moved_settings, resumed_config
from .divergence import DIVERGED, remedies_after_divergence

logger = logging.getLogger("spacy_elmo.pretrain")


@dataclass
class Resume:
    checkpoint: dict[str, Any]
    config: PretrainConfig
    remedied: dict[str, tuple[Any, Any]]  # remedies after a divergence: {setting: (old, new)}
    moved: dict[str, tuple[Any, Any]]  # where the run happens: {setting: (old, new)}


def resume_run(work: Path, given: PretrainConfig, explicit: Optional[Collection[str]]) -> Resume:
    """The checkpoint of the run in `work` and its settings (`resumed_config`)."""
    path = work / CHECKPOINT
    checkpoint = load_checkpoint(path)
    saved, remedied = remedies_after_divergence(
        checkpoint["config"], given, work / DIVERGED, explicit
    )
    config = resumed_config(saved, given, path, explicit)
    return Resume(checkpoint, config, remedied, moved_settings(saved, config))


def log_changes(resume: Resume, step: int) -> None:
    """A warning for each kind of setting that this resume (at `step`) changed."""
    if resume.remedied:
        logger.warning(
            "resuming after a divergence from the checkpoint of step %d with %s",
            step,
            _changes(resume.remedied),
        )
    if resume.moved:
        logger.warning(
            "resuming at step %d with %s: where the run happens, not what it computes "
            "(another thread count or device may round its sums differently)",
            step,
            _changes(resume.moved),
        )


def _changes(changed: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
