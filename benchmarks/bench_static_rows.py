"""StaticVectors.target_rows of two versions of pretrain/distill.py side by side, on
pretraining-sized batches (200 batches of 2,000 Zipf-distributed tokens), alternating rounds.

    python -m benchmarks.bench_static_rows OLD_DISTILL.py NEW_DISTILL.py
"""

import importlib.util
import random
import sys
import time

import numpy


def load(path: str, name: str):
    """The module at `path`, imported under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def batches_and_table():
    """Zipf-distributed word batches, a 20,000 x 300 table with a zero row, 500,000 keys."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300_000)] + [f"W{i}" for i in range(300_000)]
    table = numpy.random.default_rng(0).standard_normal((20_000, 300)).astype(numpy.float32)
    table[5] = 0
    rows = {word: rng.randrange(20_000) for word in words[:500_000]}
    zipf = numpy.random.default_rng(1).zipf(1.2, 400_000) % 650_000
    stream = [words[i] if i < len(words) else f"unk{i}" for i in zipf]
    batches = [
        [stream[i : i + 20] for i in range(start, start + 2000, 20)]
        for start in range(0, 400_000, 2000)
    ]
    return batches, table, rows


def main(old_path: str, new_path: str) -> None:
    old = load(old_path, "old_distill")
    new = load(new_path, "new_distill")
    batches, table, rows = batches_and_table()
    for label, module in (("old", old), ("new", new), ("old", old), ("new", new)):
        vectors = module.StaticVectors(table, rows)
        start = time.perf_counter()
        for batch in batches:
            vectors.target_rows(batch)
        per_batch = (time.perf_counter() - start) / len(batches)
        print(f"{label}: {1000 * per_batch:.2f} ms a batch of 2,000 tokens")
    old_vectors = old.StaticVectors(table, rows)
    new_vectors = new.StaticVectors(table, rows)
    same = all(
        (old_vectors.target_rows(batch) == new_vectors.target_rows(batch)).all()
        for batch in batches[:50]
    )
    print("same rows" if same else "ROWS DIFFER")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
