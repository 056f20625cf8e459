"""Every Nth line of a text file (the first, the N+1th, ...): a deterministic sample.

python -m workflow.sample_lines corpus/train.txt corpus/sample.txt --every 32
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spacy_elmo.util.files import atomic_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--every", type=int, required=True, help="keep one line in N")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every must be at least 1, got {args.every}")
    kept = 0
    with args.input.open("rb") as source, atomic_path(args.output) as tmp:
        with tmp.open("wb") as sink:
            for number, line in enumerate(source):
                if number % args.every == 0:
                    sink.write(line)
                    kept += 1
    print(f"{args.output}: {kept:,} lines (one in {args.every} of {args.input})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
