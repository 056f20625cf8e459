"""Training subsets of CoNLL-2003 for the learning curves: whole sentences (one Doc each, tags
and entities kept) sampled without replacement, one file per size and seed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterable, Sequence

from spacy.tokens import Doc, DocBin
from spacy.vocab import Vocab

from spacy_elmo.util.files import file_sha256

TRAIN = Path("corpus/conll/train.spacy")
SUBSETS = Path("corpus/conll/subsets")
FULL = "all"  # the size label of the whole training set


def read_docs(path: Path, vocab: Vocab | None = None) -> list[Doc]:
    """The Docs of a .spacy file."""
    if not path.exists():
        raise FileNotFoundError(f"no DocBin file {path}")
    return list(DocBin().from_disk(path).get_docs(vocab or Vocab()))


def split_sentences(docs: Iterable[Doc], source: str = "<docs>") -> list[Doc]:
    """Every sentence of ``docs`` as its own Doc (``span.as_doc()``), tags and entities kept.

    Raises ValueError if a Doc has no sentence boundaries, if an entity crosses one, or if a
    sentence Doc lost a tag or an entity of its source.
    """
    sentences = []
    for number, doc in enumerate(docs):
        if len(doc) and not doc.has_annotation("SENT_START"):
            raise ValueError(f"Doc {number} of {source} has no sentence boundaries")
        sentence_of = [0] * len(doc)
        for index, sent in enumerate(doc.sents):
            for i in range(sent.start, sent.end):
                sentence_of[i] = index
        for ent in doc.ents:
            if sentence_of[ent.start] != sentence_of[ent.end - 1]:
                raise ValueError(
                    f"entity {ent.text!r} ({ent.label_}, tokens {ent.start}-{ent.end}) of Doc "
                    f"{number} of {source} crosses a sentence boundary"
                )
        for sent in doc.sents:
            sentence = sent.as_doc()
            expected = [
                (ent.start - sent.start, ent.end - sent.start, ent.label_)
                for ent in doc.ents
                if sent.start <= ent.start < sent.end
            ]
            kept = [(ent.start, ent.end, ent.label_) for ent in sentence.ents]
            if kept != expected or [t.tag_ for t in sentence] != [t.tag_ for t in sent]:
                raise ValueError(
                    f"sentence at tokens {sent.start}-{sent.end} of Doc {number} of {source} "
                    f"lost annotation in as_doc(): entities {expected} became {kept}"
                )
            sentences.append(sentence)
    return sentences


def sample_indices(n_sentences: int, size: int, seed: int) -> list[int]:
    """``size`` of ``range(n_sentences)`` drawn without replacement by random.Random(seed)."""
    if not 0 < size <= n_sentences:
        raise ValueError(f"subset size {size} is not in 1..{n_sentences} (training sentences)")
    return sorted(random.Random(seed).sample(range(n_sentences), size))


def subset_name(size: int, seed: int) -> str:
    return f"train_{size}_s{seed}.spacy"


def make_subsets(
    train: Path, sizes: Sequence[int], seeds: Sequence[int], output: Path
) -> list[Path]:
    """Write ``train_{size}_s{seed}.spacy`` for every size and seed; return their paths.

    Each file has a ``.json`` spec next to it (source checksum, size, seed); a file whose spec
    is unchanged is kept as it is.
    """
    if not train.exists():
        raise FileNotFoundError(f"no training file {train} (run `spacy project run convert-conll`)")
    output.mkdir(parents=True, exist_ok=True)
    source_sha256 = file_sha256(train)
    sentences: list[Doc] | None = None
    written = []
    for size in sizes:
        for seed in seeds:
            path = output / subset_name(size, seed)
            spec_path = path.with_suffix(".json")
            spec = {
                "source": str(train),
                "source_sha256": source_sha256,
                "size": size,
                "seed": seed,
                "sampling": "sorted(random.Random(seed).sample(range(n_sentences), size))",
            }
            if path.exists() and spec_path.exists():
                old = json.loads(spec_path.read_text())
                if {key: old.get(key) for key in spec} == spec:
                    print(f"[subsets] {path} is up to date")
                    written.append(path)
                    continue
            if sentences is None:
                sentences = split_sentences(read_docs(train), str(train))
            chosen = sample_indices(len(sentences), size, seed)
            DocBin(docs=[sentences[i] for i in chosen], store_user_data=False).to_disk(path)
            spec["source_sentences"] = len(sentences)
            spec_path.write_text(json.dumps(spec, indent=2) + "\n")
            n_ents = sum(len(sentences[i].ents) for i in chosen)
            n_tokens = sum(len(sentences[i]) for i in chosen)
            print(f"[subsets] {path}: {size} sentences, {n_tokens} tokens, {n_ents} entities")
            written.append(path)
    return written


def count_sentences(path: Path) -> int:
    """Sentences in a .spacy file (a Doc without sentence boundaries counts as one)."""
    return sum(
        sum(1 for _ in doc.sents) if doc.has_annotation("SENT_START") else 1
        for doc in read_docs(path)
        if len(doc)
    )
