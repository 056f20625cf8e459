"""The table of a `compare_commits.sh` run: each measure before and after, the fastest round
with the median of the rounds in brackets.

    python -m benchmarks.compare_summary OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _bilm(result: dict, arch: str, key: str) -> float:
    return result["results"][arch]["spacy-elmo-cpu"][key]


def _elmo(result: dict, key: str) -> float:
    return result["summary"]["elmo"][key]


def _fused(result: dict) -> float:
    return result["results"]["fused LSTM, trimmed CNN"]["tokens_per_s"]


# (measure, file prefix, its value in a result, the better of two values); a biLM shape the run
# did not measure gives no row.
MEASURES = [
    (
        f"biLM, {arch}{'' if arch == 'bundled' else ' preset'}, batch {batch}, tokens/s",
        "bilm",
        lambda r, arch=arch, batch=batch: _bilm(r, arch, f"b{batch}_tokens_per_s"),
        max,
    )
    for arch in ("small", "medium", "original", "bundled")
    for batch in (32, 1)
] + [
    ("elmo pipeline, `nlp.pipe` words/s", "pipeline", lambda r: _elmo(r, "batch_words_per_s"), max),
    ("elmo pipeline, one sentence, median ms", "pipeline",
     lambda r: _elmo(r, "sentence_ms_median"), min),
    ("pretraining step (fused), tokens/s", "pretrain", _fused, max),
]  # fmt: skip


def _value(value, path: Path) -> float | None:
    """The measure in one result file, None where the run did not measure it."""
    try:
        return value(json.loads(path.read_text()))
    except KeyError:
        return None


def rows(out: Path) -> list[tuple[str, str, str]]:
    table = []
    for name, prefix, value, best in MEASURES:
        cells = []
        for side in ("before", "after"):
            files = sorted(out.glob(f"{prefix}_{side}_*.json"))
            values = [v for v in (_value(value, f) for f in files) if v is not None]
            if not values:
                break
            digits = 1 if "ms" in name else 0
            cells.append(f"{best(values):,.{digits}f} ({statistics.median(values):,.{digits}f})")
        if len(cells) == 2:
            table.append((name, *cells))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print("| measure | before | after |\n|---|---:|---:|")
    for name, before, after in rows(args.out):
        print(f"| {name} | {before} | {after} |")


if __name__ == "__main__":
    main()
