"""The dictionaries of an ELMoForManyLangs model (`char.dic`, `word.dic`): tokens to its
character and word ids, as their `read_list` and `create_one_batch` make them, and the
`lexicon.json` in which `BiLM.save` keeps them (elmoformanylangs.py reads the rest of a model)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ..description.chars import MAX_CHARS_PER_TOKEN, place_rows
from ..description.options import BiLMOptions
from ..util.files import write_text
from ..util.json_files import MAX_LEXICON_BYTES, MissingFileError, read_json

LEXICON_NAME = "lexicon.json"  # what `BiLM.save` writes next to the weights
LEXICON_FORMAT = "spacy-elmo-efml-lexicon"

BOS, EOS, OOV, PAD, BOW, EOW = "<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"
CHAR_SPECIALS = (BOS, EOS, OOV, PAD, BOW, EOW)
WORD_SPECIALS = (OOV, PAD)  # `<bos>`/`<eos>` fall back to `<oov>` as in their code


# ---------------------------------------------------------------------- tokens -> ids
@dataclass
class EfmlLexicon:
    """Tokens to the ids of an ELMoForManyLangs model (their `read_list` + `create_one_batch`).

    A row is 50 char ids, then the word id when the model has a word embedding; every id is
    the dictionary id + 1, so that 0 means "no token" as in ELMo's `batch_to_ids`.
    """

    chars: dict[str, int]
    words: dict[str, int] | None = None
    _rows: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        tables = [("character", self.chars, CHAR_SPECIALS), ("word", self.words, WORD_SPECIALS)]
        for kind, table, specials in tables:
            if table is None and kind == "word":
                continue  # a model without a word embedding
            if not isinstance(table, dict) or not all(
                isinstance(k, str) and isinstance(v, int) for k, v in table.items()
            ):
                raise ValueError(f"the {kind} dictionary is not an object of token: integer id")
            missing = [s for s in specials if s not in table]
            if missing:
                raise ValueError(f"the {kind} dictionary has no {', '.join(missing)}")

    @property
    def padding_id(self) -> int:
        """The (shifted) id of `<pad>` in the char slots after a word."""
        return self.chars[PAD] + 1

    @property
    def bos_ids(self) -> tuple[int, ...]:
        return self.token_ids(BOS)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.token_ids(EOS)

    def token_ids(self, token: str) -> tuple[int, ...]:
        """The shifted ids of one token (their code's ids + 1), kept for the next time."""
        known = self._rows.get(token)
        if known is not None:
            return known
        chars = self.chars
        cut = token[: MAX_CHARS_PER_TOKEN - 2]  # code points, not bytes (their read_list)
        # Their create_one_batch reads `bow_id, eow_id` from '<eow>', '<bow>': in this order.
        begin, end = chars[EOW], chars[BOW]
        if cut in (BOS, EOS):
            inner = [chars[cut]]
        else:
            oov = chars[OOV]
            inner = [chars.get(c, oov) for c in cut]
        row = [begin, *inner, end]
        row += [chars[PAD]] * (MAX_CHARS_PER_TOKEN - len(row))
        if self.words is not None:
            row.append(self.words.get(cut, self.words[OOV]))
        # From a list: a tuple grown from a generator passes 512 bytes on its way and stays a
        # block of the C heap, not of Python's small-object pools, for as long as it is kept.
        ids = tuple([i + 1 for i in row])
        if len(self._rows) < 2**17:
            self._rows[token] = ids
        return ids

    def batch_to_ids(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """Ids of a batch, (batch, max_tokens, a row), without `<bos>`/`<eos>`; 0 = no token."""
        row_width = MAX_CHARS_PER_TOKEN + (self.words is not None)
        return place_rows(sentences, lambda tokens: list(map(self.token_ids, tokens)), row_width)

    def check_sizes(self, options: BiLMOptions, source: str) -> None:
        """Raise ValueError when an id is past the embedding tables of `options`."""
        tables = [("character", self.chars, options.n_characters)]
        if self.words is not None:
            tables.append(("word", self.words, options.n_words))
        for kind, dictionary, rows in tables:
            for token, index in dictionary.items():
                if not 0 <= index < rows - 1:  # the table's row 0 is the "no token" row
                    raise ValueError(
                        f"{source}: the {kind} dictionary gives {token!r} the id {index} but the "
                        f"{kind} embedding has {rows - 1} rows (ids 0 to {rows - 2}); the "
                        f"dictionary does not match the weights"
                    )
        if (self.words is not None) != (options.word_embedding_dim > 0):
            raise ValueError(
                f"{source}: the word dictionary and the word embedding must come together"
            )

    # ------------------------------------------------------------------ saving
    def to_json(self) -> str:
        """The dictionaries as one JSON document (what `save` writes, no pickle)."""
        data = {
            "format": LEXICON_FORMAT,
            "version": 1,
            "max_characters_per_token": MAX_CHARS_PER_TOKEN,
            "chars": self.chars,
            "words": self.words,
        }
        return json.dumps(data, ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str, source: str = "lexicon") -> EfmlLexicon:
        """Read what `to_json` wrote; ValueError naming `source` when it is not that."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{source} is not valid JSON: {err}") from None
        return cls.from_data(data, source)

    @classmethod
    def from_data(cls, data: Any, source: str = "lexicon") -> EfmlLexicon:
        """The lexicon in the parsed JSON of `to_json`; ValueError naming `source` if not one."""
        if not isinstance(data, dict) or data.get("format") != LEXICON_FORMAT:
            raise ValueError(f"{source} is not a spacy-elmo lexicon (no format '{LEXICON_FORMAT}')")
        try:
            return cls(data.get("chars"), data.get("words"))
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    def save(self, directory: str | Path) -> None:
        """Write `lexicon.json` into `directory`."""
        write_text(Path(directory) / LEXICON_NAME, self.to_json() + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> EfmlLexicon:
        """Read the `lexicon.json` written by `save`."""
        path = Path(directory) / LEXICON_NAME
        what = "lexicon (the dictionaries of a saved ELMoForManyLangs biLM)"
        return cls.from_data(read_json(path, what, MAX_LEXICON_BYTES), str(path))


def read_dictionary(path: Path, rows: int | None = None, table: str = "") -> dict[str, int]:
    """A `token<TAB>id` file read exactly as their `Embedder.get_model` does.

    Each line is stripped of surrounding whitespace first, so a whitespace character loses its
    token and the line is read as U+3000 (their code: `tokens.insert(0, '\\u3000')`); a later
    line with the same token wins. An id is a row of the embedding `table` (`rows` rows, when
    given): ValueError naming the line of one that is negative or past the last row.
    """
    if not path.exists():
        raise MissingFileError(2, "ELMoForManyLangs dictionary does not exist", str(path))
    dictionary: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text: {err}") from None
    # Their codecs.open reader splits lines at every Unicode line boundary, as splitlines does.
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        try:
            token, index = fields
            dictionary[token] = int(index)
        except ValueError:
            raise ValueError(
                f"{path}, line {number}: expected 'token<TAB>id', got {line.rstrip()!r:.80}"
            ) from None
        if dictionary[token] < 0 or (rows is not None and dictionary[token] >= rows):
            limit = f"0 to {rows - 1}, the rows of {table}" if rows is not None else "0 or more"
            raise ValueError(
                f"{path}, line {number}: the id of {token!r} is {dictionary[token]}; ids are "
                f"{limit}"
            )
    if not dictionary:
        raise ValueError(f"{path} is empty")
    return dictionary
