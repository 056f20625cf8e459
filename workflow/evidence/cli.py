"""CoNLL-2003 learning curves of NER + tagger pipelines (`spacy project run evidence`; the
transformer pipeline, hours a run on CPU, is opt-in: `spacy project run evidence-transformer`).

    python -m workflow.evidence subsets --train corpus/conll/train.spacy --sizes 1000 3000 \
        --seeds 0 1 2 --output corpus/conll/subsets
    python -m workflow.evidence run --pipeline elmo --size 1000 --seed 0 [--dry-run]
    python -m workflow.evidence runs --pipelines baseline vectors elmo vectors+elmo \
        --sizes 1000 3000 all --seeds 0 1 2 --full-seeds 0 [--jobs 1]
    python -m workflow.evidence keep --root training/evidence --pipelines transformer \
        --dest results/transformer_runs
    python -m workflow.evidence report --root training/evidence results/transformer_runs \
        --json results/evidence.json --markdown results/evidence.md --plot docs/evidence.png \
        [--page docs/learning-curves.md] [--readme README.md]

`subsets` samples whole sentences (one Doc each, tags and entities kept) without replacement.
`run` trains one tagger + NER pipeline with `python -m spacy train` (the transformer with
`python -m workflow.resumable_train`, which resumes a stopped run) into
ROOT/{pipeline}_{size}_s{seed}/, scores model-best on the test set with gold tokens and writes
run.json; a run whose run.json exists is skipped. `keep` copies the run.json of finished runs
(the transformer's take hours) to a folder that the repository keeps. `report` turns every
run.json into the JSON, the Markdown tables (mean ± std over seeds of test NER F1 and tag
accuracy) and the plot; with `--page` it puts the tables in that docs page between
<!-- evidence:start --> and <!-- evidence:end --> (and the list of finished transformer runs
between <!-- evidence-runs:start --> and <!-- evidence-runs:end -->, if the page has them), and
with `--readme` the NER F1 table between <!-- evidence-headline:start --> and
<!-- evidence-headline:end -->.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workflow.evidence.report import (
    BILM_CARD,
    BILM_NAME,
    HEADLINE_MARKER,
    MARKER,
    PAGE,
    README,
    TRANSFORMER_RUNS,
    write_report,
)
from workflow.evidence.runs import (
    DEV,
    PIPELINES,
    ROOT,
    TEST,
    VECTORS,
    RunError,
    keep_runs,
    make_spec,
    plan_runs,
    run_many,
    run_one,
)
from workflow.evidence.subsets import FULL, SUBSETS, TRAIN, make_subsets

# `runs` without --pipelines: those that need no optional package (the transformer is opt-in)
DEFAULT_PIPELINES = [name for name, pipeline in PIPELINES.items() if pipeline.package is None]


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
        "components.ner.model.tok2vec.elmo.layer_dropout=0.2 (repeatable; a variant goes in its "
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
    parser = argparse.ArgumentParser(
        prog="python -m workflow.evidence", description=__doc__.split("\n\n")[0]
    )
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
    runs.add_argument(
        "--pipelines",
        nargs="+",
        default=DEFAULT_PIPELINES,
        choices=list(PIPELINES),
        help=f"default: {' '.join(DEFAULT_PIPELINES)} (those without an optional package)",
    )
    runs.add_argument("--sizes", nargs="+", required=True, help=f"numbers of sentences, {FULL!r}")
    runs.add_argument("--seeds", type=int, nargs="+", required=True)
    runs.add_argument(
        "--full-seeds", type=int, nargs="+", default=None, help=f"seeds of {FULL!r} (--seeds)"
    )
    runs.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    runs.add_argument("--keep-going", action="store_true", help="go on after a failed run")
    add_run_options(runs)

    keep = commands.add_parser(
        "keep", help="copy the run.json of finished runs into a folder kept in the repository"
    )
    keep.add_argument("--root", type=Path, default=ROOT, help=f"runs folder ({ROOT})")
    keep.add_argument("--pipelines", nargs="+", default=["transformer"], choices=list(PIPELINES))
    keep.add_argument("--dest", type=Path, default=TRANSFORMER_RUNS, help=f"({TRANSFORMER_RUNS})")

    rep = commands.add_parser("report", help="JSON, Markdown tables and plot of all runs")
    rep.add_argument(
        "--root",
        type=Path,
        nargs="+",
        default=[ROOT],
        help=f"runs folders ({ROOT}) or earlier report JSON files (their runs); a run in "
        "several is taken from the first",
    )
    rep.add_argument("--bilm-card", type=Path, default=BILM_CARD)
    rep.add_argument(
        "--bilm-name", default=BILM_NAME, help=f"what the card describes ({BILM_NAME!r})"
    )
    rep.add_argument("--json", type=Path, required=True)
    rep.add_argument("--markdown", type=Path, required=True)
    rep.add_argument("--plot", type=Path, required=True)
    rep.add_argument(
        "--page",
        type=Path,
        default=None,
        help=f"a docs page whose {MARKER} markers get the tables (e.g. {PAGE})",
    )
    rep.add_argument(
        "--readme",
        type=Path,
        default=None,
        help=f"a README whose {HEADLINE_MARKER} markers get the NER F1 table (e.g. {README})",
    )
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
    elif args.command == "keep":
        kept = keep_runs(args.root, args.pipelines, args.dest)
        print(f"[keep] {len(kept)} finished runs in {args.dest}: {', '.join(kept) or 'none'}")
    elif args.command == "report":
        write_report(
            args.root,
            args.json,
            args.markdown,
            args.plot,
            args.bilm_card,
            args.page,
            args.bilm_name,
            args.readme,
        )
    return 0
