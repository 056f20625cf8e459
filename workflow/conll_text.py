"""One CoNLL-2003 file as text, one sentence a line (gold tokens): for evaluation only.

The dev text measures a biLM's perplexity on in-domain sentences that no pretraining stage
reads (pretraining reads only the training sentences, `extract_text.py conll2003`).

    python -m workflow.conll_text assets/conll2003/valid.txt corpus/conll_dev_text.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workflow.conll import read_words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("conll_file", type=Path)
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    sentences = [" ".join(words) for words in read_words(args.conll_file)]
    args.output.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    print(f"{args.output}: {len(sentences)} sentences")


if __name__ == "__main__":
    main()
