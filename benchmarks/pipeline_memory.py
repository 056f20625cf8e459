"""Peak resident memory of one process that runs a trained elmo pipeline over a DocBin's texts
with `nlp.pipe` (batch 256), each doc dropped once counted: one JSON line with the peak RSS
after loading, the peak RSS and the words read. Run it once per checkout and setting,
alternating, and compare the peaks; `--overlap on|off` overrides the component's setting.

    python -m benchmarks.pipeline_memory MODEL corpus/conll/test.spacy [--overlap on|off]
"""

from __future__ import annotations

import argparse
import json
import resource

import spacy
from spacy.tokens import DocBin


def peak_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a trained pipeline with an elmo component")
    parser.add_argument("docbin", help="a .spacy file whose texts are read")
    parser.add_argument("--overlap", choices=("on", "off"), default=None)
    parser.add_argument("--threads", type=int, default=2, help="torch's CPU threads")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    config = {} if args.overlap is None else {"components.elmo.overlap": args.overlap == "on"}
    nlp = spacy.load(args.model, config=config)
    texts = [doc.text for doc in DocBin().from_disk(args.docbin).get_docs(nlp.vocab)]
    loaded = peak_mb()
    words = sum(len(doc) for doc in nlp.pipe(texts, batch_size=256))
    record = {
        "overlap": nlp.get_pipe("elmo").cfg["overlap"],
        "texts": len(texts),
        "words": words,
        "peak_mb_after_load": round(loaded),
        "peak_mb": round(peak_mb()),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
