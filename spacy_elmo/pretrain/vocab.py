"""The word vocabulary of the softmax targets (the input side stays character-based)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

from ..description.chars import BOS_TOKEN, EOS_TOKEN
from ..util.files import write_text

UNK_TOKEN = "<UNK>"
SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


class Vocab:
    """Words sorted by frequency (what an adaptive softmax needs), specials first."""

    def __init__(self, words: list[str]) -> None:
        if list(words[: len(SPECIALS)]) != list(SPECIALS):
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {words[:3]}")
        if len(set(words)) != len(words):
            raise ValueError("the vocabulary has duplicate words")
        self.words = list(words)
        self.index = {word: i for i, word in enumerate(self.words)}
        self.unk = self.index[UNK_TOKEN]
        self.bos = self.index[BOS_TOKEN]
        self.eos = self.index[EOS_TOKEN]

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.index.get(token, self.unk) for token in tokens]

    @classmethod
    def build(cls, sentences: Iterable[list[str]], max_size: int, min_count: int) -> Vocab:
        """The `max_size` most frequent words seen at least `min_count` times."""
        counts: Counter[str] = Counter()
        for sentence in sentences:
            counts.update(sentence)
        for special in SPECIALS:
            counts.pop(special, None)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        words = [w for w, c in ranked if c >= min_count][: max(0, max_size - len(SPECIALS))]
        return cls([*SPECIALS, *words])

    def to_file(self, path: Path) -> None:
        """One word per line, written atomically."""
        write_text(path, "\n".join(self.words) + "\n")

    @classmethod
    def from_file(cls, path: Path) -> Vocab:
        try:
            words = Path(path).read_text(encoding="utf-8").split("\n")
            return cls([w for w in words if w])
        except ValueError as err:  # also UnicodeDecodeError
            raise ValueError(f"vocabulary file {path}: {err}") from None
