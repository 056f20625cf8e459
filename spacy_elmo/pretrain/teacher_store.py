"""The teacher's word vectors of a tokenised corpus, computed once, on disk (`teacher_store`).

The teacher runs once over the corpus before pretraining, so that a training step costs no
teacher time. A store is a folder:

* `vectors.f16`: float16 rows, one per word of each distinct sentence (NaN: no target);
* `index.bin`: per distinct sentence (key, first row, words), int64 each; the key is the first
  8 bytes of the blake2b hash of the sentence's line, so a sentence repeated in the corpus
  (the in-domain text read several times) is computed and stored once;
* `store.json`: what it was made from (the corpus's sha256, the teacher's identity), its size,
  the per-dimension mean and standard deviation of the vectors (targets are standardised with
  them) and the counts of words without a target; `complete` once the whole corpus is in;
* `progress.json` while it is built: the lines read and the bytes of both files at the last
  flush. A killed build resumes there (the files are cut back to those bytes).

A store made from another corpus or another teacher is refused, never mixed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy
import torch

from ..util.files import file_sha256, write_text
from .teacher import Teacher, TeacherCounts

logger = logging.getLogger("spacy_elmo.pretrain")

FORMAT = "spacy-elmo-teacher-store"
VERSION = 1
STORE, PROGRESS, INDEX, VECTORS = "store.json", "progress.json", "index.bin", "vectors.f16"
INDEX_FIELDS = 3  # key, first row, number of words (int64 each)
FLUSH_SENTENCES = 2048  # sentences between flushes (the unit of a resumed build)
BATCH_PIECES = 4096  # padded word pieces a teacher batch holds at most


def sentence_key(words: Sequence[str]) -> int:
    """The store's key of a sentence: its line's blake2b hash, 8 bytes, as an int64."""
    digest = hashlib.blake2b(" ".join(words).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _lines(corpus: Path, start: int) -> Iterator[list[str]]:
    """The corpus's lines as word lists from line `start` on (empty lines as [])."""
    with corpus.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if number >= start:
                line = line.rstrip("\n")
                yield line.split(" ") if line else []


def _read_json(path: Path) -> Optional[dict]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"teacher store file {path} is not readable JSON ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"teacher store file {path} is not a JSON object")
    return record


def plan_size(corpus: Path) -> tuple[int, int]:
    """(distinct sentences, their words) of a tokenised corpus: the store holds a row a word."""
    seen: set[int] = set()
    words = 0
    for sentence in _lines(corpus, 0):
        if sentence:
            key = sentence_key(sentence)
            if key not in seen:
                seen.add(key)
                words += len(sentence)
    return len(seen), words


def build_store(
    store: Path,
    corpus: Path,
    teacher: Teacher,
    max_gb: float = 20.0,
    report: Callable[[str], None] = logger.info,
) -> dict:
    """Make (or finish) the store of `corpus` with `teacher`; returns its store.json record.

    Refuses a store made from another corpus or teacher, and a store over `max_gb`.
    """
    store.mkdir(parents=True, exist_ok=True)
    key = {"corpus_sha256": file_sha256(corpus), "teacher": teacher.identity()}
    record = _read_json(store / STORE)
    if record is not None:
        _check_key(store, record, key, teacher.source, corpus)
        if record.get("complete"):
            return record
    else:
        sentences, words = plan_size(corpus)
        record = {
            "format": FORMAT,
            "version": VERSION,
            **key,
            "teacher_source": teacher.source,
            "layer": teacher.layer,
            "dim": teacher.dim,
            "sentences": sentences,
            "words": words,
            "bytes": words * teacher.dim * 2 + sentences * INDEX_FIELDS * 8,
            "complete": False,
        }
        if record["bytes"] > max_gb * 2**30:
            raise ValueError(
                f"teacher store {store}: {corpus} needs {record['bytes'] / 2**30:.1f} GiB "
                f"({words:,} words x {teacher.dim} float16), over the limit of {max_gb:g} GiB; "
                f"give less text or a higher limit"
            )
        write_text(store / STORE, json.dumps(record, indent=2) + "\n")
    report(
        f"teacher store {store}: {record['sentences']:,} distinct sentences, {record['words']:,} "
        f"words, {record['bytes'] / 2**30:.2f} GiB on disk (float16, {record['dim']} wide)"
    )
    progress = _read_json(store / PROGRESS) or {
        "lines": 0,
        "index_bytes": 0,
        "vector_bytes": 0,
        "sum": [0.0] * teacher.dim,
        "sum_squares": [0.0] * teacher.dim,
        "counts": {"words": 0, "empty": 0, "cut": 0},
    }
    for name, size in ((INDEX, progress["index_bytes"]), (VECTORS, progress["vector_bytes"])):
        with (store / name).open("ab") as handle:  # a killed build's unflushed tail goes
            handle.truncate(size)
    seen = set(numpy.fromfile(store / INDEX, dtype="<i8").reshape(-1, INDEX_FIELDS)[:, 0].tolist())
    rows = progress["vector_bytes"] // (2 * teacher.dim)
    sums = numpy.array(progress["sum"], dtype=numpy.float64)
    squares = numpy.array(progress["sum_squares"], dtype=numpy.float64)
    counts = TeacherCounts(**progress["counts"])
    lines = progress["lines"]
    if lines:
        report(f"teacher store {store}: resuming after line {lines:,}")
    pending: list[list[str]] = []
    pending_lines = 0
    with (store / INDEX).open("ab") as index, (store / VECTORS).open("ab") as vectors:

        def flush() -> None:
            nonlocal rows, lines, pending, pending_lines
            for sentence, matrix in _run_teacher(teacher, pending, counts):
                index.write(numpy.array([sentence, rows, len(matrix)], dtype="<i8").tobytes())
                stored = matrix.astype("<f2")  # the statistics are those of the stored values
                vectors.write(stored.tobytes())
                rows += len(matrix)
                finite = stored[~numpy.isnan(stored[:, 0])].astype(numpy.float64)
                numpy.add(sums, finite.sum(axis=0), out=sums)
                numpy.add(squares, (finite**2).sum(axis=0), out=squares)
            for handle in (index, vectors):
                handle.flush()
                os.fsync(handle.fileno())
            lines += pending_lines
            pending, pending_lines = [], 0
            progress.update(
                lines=lines,
                index_bytes=index.tell(),
                vector_bytes=vectors.tell(),
                sum=sums.tolist(),
                sum_squares=squares.tolist(),
                counts=vars(counts),
            )
            write_text(store / PROGRESS, json.dumps(progress) + "\n")
            report(f"teacher store {store}: {len(seen):,} of {record['sentences']:,} sentences")

        for sentence in _lines(corpus, lines):
            pending_lines += 1
            if sentence:
                key_of = sentence_key(sentence)
                if key_of not in seen:
                    seen.add(key_of)
                    pending.append(sentence)
            if len(pending) >= FLUSH_SENTENCES:
                flush()
        flush()
    n = max(1, counts.words)
    mean = sums / n
    std = numpy.sqrt(numpy.maximum(squares / n - mean**2, 0.0))
    record.update(
        complete=True,
        mean=mean.tolist(),
        std=std.tolist(),
        counts=vars(counts),
    )
    write_text(store / STORE, json.dumps(record, indent=2) + "\n")
    (store / PROGRESS).unlink(missing_ok=True)
    report(
        f"teacher store {store}: complete; {counts.words:,} words with a target, {counts.empty:,} "
        f"without word pieces, {counts.cut:,} cut by the teacher's length limit"
    )
    return record


def _run_teacher(
    teacher: Teacher, sentences: list[list[str]], counts: TeacherCounts
) -> Iterator[tuple[int, numpy.ndarray]]:
    """(key, word vectors) of each sentence, in the given order; batched by length."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results: dict[int, numpy.ndarray] = {}
    start = 0
    while start < len(order):
        # Words stand in for pieces (about 1.3 a word in English): a length-sorted batch.
        end = start + 1
        while end < len(order) and (end - start + 1) * 2 * len(sentences[order[end]]) <= (
            BATCH_PIECES
        ):
            end += 1
        batch = [sentences[i] for i in order[start:end]]
        matrices, batch_counts = teacher.word_vectors(batch)
        counts.add(batch_counts)
        results.update(zip(order[start:end], matrices))
        start = end
    for i, sentence in enumerate(sentences):
        yield sentence_key(sentence), results[i]


def _check_key(store: Path, record: dict, key: dict, source: str, corpus: Path) -> None:
    if record.get("format") != FORMAT or record.get("version") != VERSION:
        raise ValueError(f"teacher store {store}: {STORE} is not a version-{VERSION} teacher store")
    for name, value in key.items():
        if record.get(name) != value:
            made = "corpus" if name == "corpus_sha256" else "teacher"
            raise ValueError(
                f"teacher store {store} was made from another {made} "
                f"({record.get('teacher_source')!r} over a corpus with sha256 "
                f"{str(record.get('corpus_sha256'))[:12]}...), not this run's ({source!r} over "
                f"{corpus}); give another --teacher-store or delete this one"
            )


def wait_for_store(store: Path, poll_seconds: float = 5.0) -> None:
    """Wait until another process has completed the store (ranks > 0 under torchrun)."""
    while True:
        record = _read_json(store / STORE)
        if record is not None and record.get("complete"):
            return
        time.sleep(poll_seconds)


class TeacherStore:
    """A complete store, read-only: standardised target vectors for batches of sentences."""

    def __init__(self, store: Path, corpus_sha256: Optional[str] = None) -> None:
        record = _read_json(store / STORE)
        if record is None or not record.get("complete"):
            raise ValueError(f"teacher store {store} is missing or not complete")
        if corpus_sha256 is not None and record.get("corpus_sha256") != corpus_sha256:
            raise ValueError(f"teacher store {store} was made from another corpus")
        self.path = store
        self.dim = int(record["dim"])
        index = numpy.fromfile(store / INDEX, dtype="<i8").reshape(-1, INDEX_FIELDS)
        order = numpy.argsort(index[:, 0], kind="stable")
        self._keys, self._rows = index[order, 0], index[order, 1:]
        n_rows = int((self._rows[:, 0] + self._rows[:, 1]).max()) if len(index) else 0
        self._vectors = numpy.memmap(store / VECTORS, dtype="<f2", mode="r").reshape(-1, self.dim)
        if len(self._vectors) < n_rows:
            raise ValueError(f"teacher store {store}: {VECTORS} is shorter than its index")
        self.mean = torch.tensor(record["mean"], dtype=torch.float32)
        self.std = torch.tensor(record["std"], dtype=torch.float32).clamp(min=1e-6)

    def vectors(self, words: Sequence[str]) -> numpy.ndarray:
        """(n_words, dim) float16 vectors of one sentence of the corpus (NaN: no target)."""
        key = sentence_key(words)
        at = int(numpy.searchsorted(self._keys, key))
        if at == len(self._keys) or self._keys[at] != key:
            raise KeyError(f"teacher store {self.path} has no vectors for: {' '.join(words)[:80]}")
        start, n = (int(v) for v in self._rows[at])
        if n != len(words):
            raise ValueError(f"teacher store {self.path}: a sentence stored with {n} words")
        return self._vectors[start : start + n]

    def targets(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """(batch, time + 2, dim) standardised vectors of <S> w_1 .. w_n </S>; NaN at
        boundaries, padding and words without a target."""
        width = max(len(s) for s in sentences) + 2
        out = torch.full((len(sentences), width, self.dim), float("nan"))
        for i, sentence in enumerate(sentences):
            if sentence:
                stored = torch.from_numpy(numpy.asarray(self.vectors(sentence), numpy.float32))
                out[i, 1 : len(sentence) + 1] = (stored - self.mean) / self.std
        return out
