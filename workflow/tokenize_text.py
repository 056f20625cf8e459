#!/usr/bin/env python
"""Tokenise raw text as `spacy-elmo pretrain` tokenises it, one sentence a line.

The same splitter and sentence cap as the pretraining command (spaCy's tokenizer and rule-based
sentencizer for a language code, sentences longer than --max-tokens cut in pieces), so that raw
text can be mixed with already tokenised text (the CoNLL-2003 sentences) in one `--pretokenized`
pretraining run.

    python -m workflow.tokenize_text corpus/raw/reuters21578.txt corpus/reuters21578_tokenized.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spacy_elmo.pretrain import PretrainConfig
from spacy_elmo.pretrain.corpus import spacy_sentence_splitter, write_tokenized

DEFAULTS = PretrainConfig(inputs=["-"], output="-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="raw text files")
    parser.add_argument("output", type=Path, help="tokenised text, one sentence a line")
    parser.add_argument("--lang", default=DEFAULTS.lang, help="language of the tokenizer")
    parser.add_argument("--pipeline", default=None, help="a spaCy pipeline instead of --lang")
    parser.add_argument("--max-tokens", type=int, default=DEFAULTS.max_sentence_tokens)
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.inputs if not path.is_file()]
    if missing:
        print(f"error: no such file: {', '.join(missing)}", file=sys.stderr)
        return 1
    if args.output.resolve() in {path.resolve() for path in args.inputs}:
        print(f"error: the output {args.output} is one of the inputs", file=sys.stderr)
        return 1
    splitter = spacy_sentence_splitter(args.lang, args.pipeline)
    sentences, tokens = write_tokenized(args.inputs, args.output, splitter, args.max_tokens)
    print(f"{args.output}: {sentences:,} sentences, {tokens:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
