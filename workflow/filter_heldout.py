"""The tokenised held-out split without the sentences that come from a text trained on later.

Stage 3 of the bundled biLM reads all CoNLL-2003 training sentences, and the 1% held-out split
of stages 1 and 2 holds some of them. Its perplexity is compared across stages on the held-out
sentences that no stage has read: the tokenised sentences (TOKENISED, one a line) that are not
part of a held-out raw line (RAW_HELD_OUT) which is also a line of EXCLUDED.

    python -m workflow.filter_heldout training/bundled_v2/corpus/dev.txt corpus/dev.txt \
        corpus/raw/conll2003_train.txt --output corpus/heldout_general.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path


def held_out_without(tokenised: list[str], raw_held_out: list[str], excluded: set[str]):
    """(kept, dropped) tokenised lines: dropped if inside a raw held-out line from `excluded`."""
    sources = [line for line in raw_held_out if line in excluded]
    kept, dropped = [], []
    for line in tokenised:
        (dropped if any(line in source for source in sources) else kept).append(line)
    return kept, dropped


def read_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenised", type=Path, help="tokenised held-out sentences")
    parser.add_argument("raw_held_out", type=Path, help="the raw held-out lines they came from")
    parser.add_argument("excluded", type=Path, help="text read by a later stage")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    kept, dropped = held_out_without(
        read_lines(args.tokenised), read_lines(args.raw_held_out), set(read_lines(args.excluded))
    )
    args.output.write_text("\n".join(kept) + "\n", encoding="utf-8")
    tokens = sum(len(line.split(" ")) for line in dropped)
    print(f"{args.output}: {len(kept)} sentences kept, {len(dropped)} ({tokens} tokens) dropped")


if __name__ == "__main__":
    main()
