"""A biLM's speed (the bundled one unless --model names another) in several checkouts of the
package, side by side: each round runs every checkout once in a fresh process, alternating,
and the table gives the fastest and the median round of each. A short run, so many rounds (the
spread between rounds on a shared machine is larger than the differences it looks for).

    python -m benchmarks.bilm_side_by_side DIR DIR [DIR ...] [--rounds 6] [--model M]

Each DIR is a checkout (e.g. `git worktree add --detach DIR COMMIT`); M is what `BiLM.load`
takes (default "bundled"; e.g. a folder of options.json and weights.hdf5). A round embeds 64
sentences of 12 CoNLL-2003 test words one at a time (batch 1), then 256 sentences three times
in batches of 32, on 2 threads, with the token-vector cache off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CONLL_TEST = Path(__file__).resolve().parents[1] / "assets" / "conll2003" / "test.txt"


def one_round(checkout: Path, text: Path, model: str) -> dict[str, float]:
    """Seconds of the checkout's package (on PYTHONPATH) for batch 1 and batch 32."""
    import torch

    import spacy_elmo
    from spacy_elmo import BiLM

    package = Path(spacy_elmo.__file__).resolve()
    if not package.is_relative_to(checkout.resolve()):
        raise SystemExit(f"imported {package}, not the package of {checkout}")

    torch.set_num_threads(2)
    bilm = BiLM.load(model).eval()
    bilm.token_cache_size = 0
    words = [line.split()[0] for line in text.read_text().splitlines() if line.strip()]
    sentences = [words[i : i + 12] for i in range(0, 64 * 12, 12)]
    with torch.inference_mode():
        bilm.embed(sentences[:4])
        start = time.perf_counter()
        for sentence in sentences:
            bilm.embed([sentence])
        batch1 = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(3):
            bilm.embed(sentences * 4, batch_size=32)
        batch32 = time.perf_counter() - start
    return {"batch 1, 64 sentences, s": batch1, "batch 32, 3 x 256 sentences, s": batch32}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-in", type=Path, help=argparse.SUPPRESS)  # a worker
    parser.add_argument("--text", type=Path, default=CONLL_TEST)
    parser.add_argument("--model", default="bundled")
    args = parser.parse_args()
    if args.round_in is not None:
        print(json.dumps(one_round(args.round_in, args.text, args.model)))
        return
    from benchmarks.common import alternating_rounds

    def arguments(checkout: Path) -> list[str]:
        return [
            *map(str, args.checkouts),
            *["--round-in", str(checkout), "--text", str(args.text.resolve())],
            *["--model", args.model],
        ]

    rounds = alternating_rounds(__file__, args.checkouts, args.rounds, arguments)
    times: dict[tuple[str, str], list[float]] = {}
    for checkout, results in rounds.items():
        for result in results:
            for measure, seconds in result.items():
                times.setdefault((measure, checkout), []).append(seconds)
    print("| measure | checkout | fastest | median |\n|---|---|---:|---:|")
    for (measure, checkout), values in times.items():
        print(f"| {measure} | {checkout} | {min(values):.3f} | {statistics.median(values):.3f} |")


if __name__ == "__main__":
    main()
