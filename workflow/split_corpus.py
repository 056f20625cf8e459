#!/usr/bin/env python
"""Split text files into train and dev sets by line, deterministically and streaming.

Each non-empty line goes to dev when a keyed hash of its text (BLAKE2b, keyed by the
seed) falls below ``--dev-fraction``. The decision depends only on the line and the seed,
so it is stable across runs, input order and file boundaries, identical lines always land
on the same side (no train/dev leakage through duplicates), and nothing is held in memory.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Iterable

_SCALE = float(1 << 64)


def dev_score(line: str, seed: int) -> float:
    """Map a line to a pseudo-random number in [0, 1) fixed by its text and the seed."""
    key = str(seed).encode("utf-8")
    digest = hashlib.blake2b(line.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big") / _SCALE


def is_dev(line: str, dev_fraction: float, seed: int) -> bool:
    """True if ``line`` belongs to the dev split."""
    return dev_score(line, seed) < dev_fraction


def split_files(
    inputs: Iterable[Path], train: Path, dev: Path, dev_fraction: float, seed: int
) -> dict[str, int]:
    """Stream every line of ``inputs`` into ``train`` or ``dev``; return line and word counts."""
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev fraction must be in [0, 1], got {dev_fraction}")
    counts = {"train_lines": 0, "train_words": 0, "dev_lines": 0, "dev_words": 0}
    for path in (train, dev):
        path.parent.mkdir(parents=True, exist_ok=True)
    train_tmp, dev_tmp = train.with_name(train.name + ".part"), dev.with_name(dev.name + ".part")
    with (
        train_tmp.open("w", encoding="utf-8", newline="\n") as f_train,
        dev_tmp.open("w", encoding="utf-8", newline="\n") as f_dev,
    ):
        for path in inputs:
            with path.open(encoding="utf-8") as f_in:
                for raw in f_in:
                    line = raw.strip()
                    if not line:
                        continue
                    side = "dev" if is_dev(line, dev_fraction, seed) else "train"
                    (f_dev if side == "dev" else f_train).write(line + "\n")
                    counts[f"{side}_lines"] += 1
                    counts[f"{side}_words"] += len(line.split())
    train_tmp.replace(train)
    dev_tmp.replace(dev)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="plain-text files, one unit a line")
    parser.add_argument("--train", type=Path, required=True, help="output training file")
    parser.add_argument("--dev", type=Path, required=True, help="output held-out file")
    parser.add_argument("--dev-fraction", type=float, default=0.01, help="share of lines in dev")
    parser.add_argument("--seed", type=int, default=0, help="hash key; changes the split")
    args = parser.parse_args(argv)
    resolved = {p.resolve() for p in args.inputs}
    for out in (args.train, args.dev):
        if out.resolve() in resolved:
            parser.error(f"output {out} is also an input")
    missing = [str(p) for p in args.inputs if not p.is_file()]
    if missing:
        parser.error(f"input file(s) not found: {missing}")
    try:
        counts = split_files(args.inputs, args.train, args.dev, args.dev_fraction, args.seed)
    except (ValueError, UnicodeDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"train: {args.train} {counts['train_lines']:,} lines, {counts['train_words']:,} words")
    print(f"dev:   {args.dev} {counts['dev_lines']:,} lines, {counts['dev_words']:,} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
