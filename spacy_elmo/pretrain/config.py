"""The settings of a pretraining run: `PretrainConfig`, its defaults and checks, and what a
resumed run may change."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Collection, Optional

from ..weights.sources import resolve_source
from .presets import preset

DEFAULT_MAX_STEPS = 10000


def _within(default: Any, low: float, exclusive: bool = False, high: Optional[float] = None) -> Any:
    """A numeric setting: its default, and the range its values lie in (> `low` when
    `exclusive`, else >= `low`; < `high`); None is allowed when it is the default."""
    return field(default=default, metadata={"bounds": (low, exclusive, high)})


@dataclass
class PretrainConfig:
    """Everything that defines a pretraining run (saved in every checkpoint)."""

    inputs: list[str]
    output: str
    preset: str = "bundled"
    options: Optional[dict[str, Any]] = None  # bilm-tf options; overrides `preset`
    dev: list[str] = field(default_factory=list)  # else every `dev_every`-th sentence
    dev_every: int = _within(100, 1)
    max_dev_sentences: int = _within(2000, 1)
    lang: str = "en"  # the language whose tokenizer reads raw text
    pipeline: Optional[str] = None  # a spaCy pipeline (name or path) that reads it instead
    pretokenized: bool = False
    vocab_size: int = _within(50000, 4)
    min_count: int = _within(3, 1)
    max_sentence_tokens: int = _within(50, 1)
    batch_tokens: int = _within(2048, 1)
    # None: DEFAULT_MAX_STEPS, or the checkpoint's on resume
    max_steps: Optional[int] = _within(None, 1)
    learning_rate: float = _within(2e-3, 0, exclusive=True)
    warmup_steps: int = _within(200, 0)
    dropout: float = _within(0.1, 0, high=1)
    clip_norm: float = _within(10.0, 0, exclusive=True)
    eval_every: int = _within(500, 1)
    checkpoint_every: int = _within(200, 1)
    log_every: int = _within(20, 1)
    seed: int = _within(0, 0)
    gpu_id: int = _within(-1, -1)
    mixed_precision: bool = False
    init_from: Optional[str] = None
    export_allennlp: bool = False
    max_memory_gb: Optional[float] = _within(None, 0, exclusive=True)
    threads: Optional[int] = _within(None, 1)
    static_vectors: Optional[str] = None  # spaCy pipeline whose vectors are auxiliary targets
    vectors_weight: float = _within(1.0, 0)  # weight of each of the two cosine losses (distill.py)

    def __post_init__(self) -> None:
        """Raise ValueError naming the setting whose value cannot work."""
        for setting in fields(self):
            value = getattr(self, setting.name)
            if "bounds" not in setting.metadata or (value is None and setting.default is None):
                continue
            low, exclusive, high = setting.metadata["bounds"]
            # the annotation, a string (postponed annotations): an integer setting, else a number
            kind = int if setting.type in ("int", "Optional[int]") else (int, float)
            ok = isinstance(value, kind) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value > low if exclusive else value >= low)
            ok = ok and (high is None or value < high)
            if not ok:
                what = "an integer" if kind is int else "a number"
                bounds = f"{'>' if exclusive else '>='} {low}" + (f" and < {high}" if high else "")
                raise ValueError(f"{setting.name} must be {what} {bounds}, got {value!r}")
        for name in ("inputs", "dev"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of paths (strings), got {value!r}")
        if not self.inputs:
            raise ValueError("no pretraining inputs given")
        for name in ("output", "preset", "lang"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if self.pipeline is not None and not isinstance(self.pipeline, str):
            raise ValueError(f"pipeline must be a string or None, got {self.pipeline!r}")


# Where a run happens, not what it computes: a resumed run takes the values given, and
# model/pretrain.json's "ran_with" lists them by the step each part of the run started at.
PLACEMENT = ("threads", "gpu_id", "max_memory_gb")
LOCATION_SETTINGS = ("output", *PLACEMENT)
# What a run resumed after a divergence may change, the values given taken (divergence.py).
DIVERGENCE_REMEDIES = ("learning_rate", "clip_norm", "warmup_steps")
# The retired transformer teacher's settings (docs/research/teacher.md): a checkpoint holding
# them resumes when `teacher` was None.
RETIRED_SETTINGS = (
    "teacher",
    "teacher_layer",
    "teacher_weight",
    "teacher_store",
    "teacher_store_max_gb",
)


def warmup_longer_than_run(config: PretrainConfig) -> Optional[str]:
    """A warning when the warm-up outlasts the run (the rate never reaches its peak); else None."""
    if config.max_steps is None or config.warmup_steps <= config.max_steps:
        return None
    end = config.max_steps / config.warmup_steps
    return (
        f"warmup_steps={config.warmup_steps} is longer than max_steps={config.max_steps}: the "
        f"learning rate rises linearly over the warm-up, so it starts at "
        f"1/{config.warmup_steps} of its peak (learning_rate={config.learning_rate:g}) and "
        f"stops at {end:.2%} of it without reaching it; set warmup_steps to at most "
        f"{config.max_steps} (or max_steps higher)"
    )


def resumed_config(
    saved: dict[str, Any],
    given: PretrainConfig,
    source: Path,
    explicit: Optional[Collection[str]],
    diverged: bool = False,
) -> tuple[PretrainConfig, dict[str, tuple[Any, Any]]]:
    """The checkpoint's configuration, and {setting: (old, new)} of what the resume changed;
    ValueError where `given` contradicts what it computes. `max_steps` and LOCATION_SETTINGS
    (after a divergence the DIVERGENCE_REMEDIES too) take the given values; with `explicit`
    (the settings the user gave) only those, and the output, are compared or taken."""
    if saved.get("teacher") is not None:
        raise ValueError(
            f"checkpoint {source} is of a run with a transformer teacher (teacher "
            f"{saved['teacher']!r}), which this spacy-elmo no longer has: start a new run (another "
            f"output directory, or overwrite this run)"
        )
    saved = {name: value for name, value in saved.items() if name not in RETIRED_SETTINGS}
    unknown = sorted(set(saved) - {f.name for f in fields(PretrainConfig)})
    if unknown:
        raise ValueError(
            f"checkpoint {source} has settings this spacy-elmo does not know ({', '.join(unknown)})"
        )
    try:
        config = PretrainConfig(**saved)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {source}: bad settings: {err}") from None
    may_change = (*LOCATION_SETTINGS, *(DIVERGENCE_REMEDIES if diverged else ()))
    taken = {
        f.name: getattr(given, f.name)
        for f in fields(PretrainConfig)
        if explicit is None or f.name in explicit or f.name == "output"
    }
    contradicted = [
        f"{name} is {new!r}, the run was started with {getattr(config, name)!r}"
        for name, new in taken.items()
        if name not in (*may_change, "max_steps")
        and not _same_setting(name, getattr(config, name), new)
    ]
    if contradicted:
        raise ValueError(
            f"resuming the run in {given.output}: {'; '.join(contradicted)} (checkpoint {source}). "
            f"A resumed run keeps what it computes; only max_steps and where it runs "
            f"({', '.join(LOCATION_SETTINGS)}) may change. Start a new run to change the others "
            f"(another output directory, or overwrite this run)"
        )
    located = {name: taken[name] for name in may_change if name in taken}
    changed = {
        name: (getattr(config, name), new)
        for name, new in located.items()
        if name != "output" and not _same_setting(name, getattr(config, name), new)
    }
    max_steps = given.max_steps if given.max_steps is not None else config.max_steps
    return replace(config, max_steps=max_steps, **located), changed


def _same_setting(name: str, old: Any, new: Any) -> bool:
    """Equal settings; paths are equal when they name the same file from here."""
    if name in ("inputs", "dev") and isinstance(old, list) and isinstance(new, list):
        return [os.path.realpath(p) for p in old] == [os.path.realpath(p) for p in new]
    if name == "init_from" and old is not None and new is not None:
        return os.path.realpath(old) == os.path.realpath(new)
    return old == new


def check_sources(config: PretrainConfig) -> None:
    """ValueError or FileNotFoundError for a source that is not there (inputs, held-out text,
    biLM to adapt, pipelines), before anything is written."""
    import spacy

    if config.options is None:
        preset(config.preset)  # an unknown name is refused here
    for setting in ("inputs", "dev"):
        for item in getattr(config, setting):
            if not Path(item).exists():
                raise FileNotFoundError(f"pretraining {setting} {item} does not exist")
    if config.init_from:
        resolve_source(config.init_from)
    for setting in ("pipeline", "static_vectors"):
        name = getattr(config, setting)
        if name and not (spacy.util.is_package(name) or Path(name).is_dir()):
            raise ValueError(
                f"{setting} {name!r}: not an installed spaCy pipeline or a pipeline directory"
            )
    if not config.pretokenized and config.pipeline is None:
        try:
            spacy.util.get_lang_class(config.lang)
        except ImportError as err:
            raise ValueError(f"lang {config.lang!r}: {str(err).splitlines()[0]}") from None
