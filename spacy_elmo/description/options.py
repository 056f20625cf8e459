"""The architecture of a biLM, read from (and written to) a bilm-tf options.json."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..util.json_files import read_json
from .chars import MAX_CHARS_PER_TOKEN, N_CHARACTERS

ACTIVATIONS = ("relu", "tanh")
# How tokens become character ids: ELMo's UTF-8 bytes (docs/MODEL.md §4), or the character (and
# word) dictionaries of an ELMoForManyLangs model (`elmoformanylangs.py`), which the
# biLM then carries.
CHAR_VOCABULARIES = ("bytes", "dictionary")
REQUIRED = object()
# Every field read from options.json (docs/MODEL.md §2): its key, its kind and its default
# (absent or null). A kind is the least integer allowed, a tuple of the values allowed, "flag"
# (true or false), "clip" (a number, or null, 0 or false for none) or "filters".
FIELDS: dict[str, tuple[str, Any, Any]] = {
    "char_embedding_dim": ("char_cnn.embedding.dim", 1, REQUIRED),
    "filters": ("char_cnn.filters", "filters", REQUIRED),
    "n_highway": ("char_cnn.n_highway", 0, 0),
    "activation": ("char_cnn.activation", ACTIVATIONS, "relu"),
    "lstm_dim": ("lstm.dim", 1, REQUIRED),
    "projection_dim": ("lstm.projection_dim", 1, REQUIRED),
    "n_layers": ("lstm.n_layers", 1, 1),
    "cell_clip": ("lstm.cell_clip", "clip", None),
    "proj_clip": ("lstm.proj_clip", "clip", None),
    "use_skip_connections": ("lstm.use_skip_connections", "flag", False),
    "char_vocabulary": ("char_cnn.char_vocabulary", CHAR_VOCABULARIES, "bytes"),
    "n_characters": ("char_cnn.n_characters", 2, N_CHARACTERS),
    "word_embedding_dim": ("char_cnn.word_embedding.dim", 0, 0),
    "n_words": ("char_cnn.word_embedding.n_words", 0, 0),
}
DICTIONARY_FIELDS = ("char_vocabulary", "word_embedding_dim", "n_words")


@dataclass(frozen=True)
class BiLMOptions:
    """Hyper-parameters of an ELMo biLM (docs/MODEL.md §2)."""

    char_embedding_dim: int
    filters: tuple[tuple[int, int], ...]
    n_highway: int
    activation: str
    lstm_dim: int
    projection_dim: int
    n_layers: int
    cell_clip: float | None
    proj_clip: float | None
    use_skip_connections: bool
    # Keys of options.json that we do not interpret, kept for a faithful export.
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # ELMoForManyLangs models ("dictionary"): rows of the char table (with the id-0 "no token"
    # row), and an optional word embedding concatenated with the CNN features before the
    # projection (`word_embedding_dim` wide, `n_words` rows with the id-0 row).
    char_vocabulary: str = "bytes"
    n_characters: int = N_CHARACTERS
    word_embedding_dim: int = 0
    n_words: int = 0

    @property
    def n_filters(self) -> int:
        """F, the width of the concatenated CNN features."""
        return sum(n for _, n in self.filters)

    @property
    def output_dim(self) -> int:
        """2P, the width of every output layer."""
        return 2 * self.projection_dim

    @property
    def has_char_projection(self) -> bool:
        """bilm-tf projects the CNN features only when F != P; ELMoForManyLangs always does."""
        return self.char_vocabulary == "dictionary" or self.n_filters != self.projection_dim

    @property
    def has_lstm_projection(self) -> bool:
        """bilm-tf projects the LSTM cell output only when P < D."""
        return self.projection_dim < self.lstm_dim

    @classmethod
    def from_dict(cls, options: dict[str, Any], source: str = "options") -> BiLMOptions:
        """Parse the bilm-tf options dictionary; raise ValueError naming the bad key."""
        if not isinstance(options, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(options).__name__}")
        for section in ("char_cnn", "lstm"):
            if not isinstance(options.get(section), dict):
                found = "" if section not in options else f", got {options[section]!r}"
                raise ValueError(f"{source}: missing the '{section}' object{found}")
        values = {
            name: _read_field(options, key, kind, default, source)
            for name, (key, kind, default) in FIELDS.items()
        }
        max_chars = options["char_cnn"].get("max_characters_per_token")
        if max_chars not in (None, MAX_CHARS_PER_TOKEN):
            raise ValueError(
                f"{source}: 'char_cnn.max_characters_per_token' is {max_chars}; ELMo's "
                f"character mapping has exactly {MAX_CHARS_PER_TOKEN} slots"
            )
        if values["char_vocabulary"] == "bytes":
            if values["n_characters"] not in (N_CHARACTERS - 1, N_CHARACTERS):
                raise ValueError(
                    f"{source}: 'char_cnn.n_characters' is {values['n_characters']}; expected "
                    f"{N_CHARACTERS} (or {N_CHARACTERS - 1} as written during training)"
                )
            values["n_characters"] = N_CHARACTERS
        extra = copy.deepcopy(options)  # less every key read here
        for key in [key for key, _, _ in FIELDS.values()] + ["char_cnn.max_characters_per_token"]:
            section, name = key.split(".")[:2]
            extra[section].pop(name, None)
        extra = {k: v for k, v in extra.items() if v or k not in ("char_cnn", "lstm")}
        parsed = cls(**values, extra=extra)
        parsed.validate(source)
        return parsed

    def validate(self, source: str = "options") -> None:
        """Raise ValueError when the values together cannot describe a working biLM (each one
        alone is checked as it is read)."""
        if self.projection_dim > self.lstm_dim:
            raise ValueError(
                f"{source}: 'lstm.projection_dim' ({self.projection_dim}) is larger than "
                f"'lstm.dim' ({self.lstm_dim})"
            )
        if self.char_vocabulary == "dictionary":
            if (self.word_embedding_dim > 0) != (self.n_words > 0):
                raise ValueError(
                    f"{source}: 'char_cnn.word_embedding' needs both 'dim' and 'n_words' "
                    f"(got dim {self.word_embedding_dim}, n_words {self.n_words})"
                )
        elif self.word_embedding_dim or self.n_words:
            raise ValueError(
                f"{source}: a word embedding needs 'char_cnn.char_vocabulary': 'dictionary'"
            )

    def to_dict(self) -> dict[str, Any]:
        """The options.json dictionary: every field under its key (FIELDS), but a clip of None
        and the ELMoForManyLangs keys (unknown to bilm-tf) at their defaults."""
        options = copy.deepcopy(self.extra)
        options.setdefault("char_cnn", {})["max_characters_per_token"] = MAX_CHARS_PER_TOKEN
        for name, (key, _, default) in FIELDS.items():
            value = getattr(self, name)
            if value is None or (name in DICTIONARY_FIELDS and value == default):
                continue
            *parents, last = key.split(".")
            holder = options
            for part in parents:
                holder = holder.setdefault(part, {})
            holder[last] = [list(pair) for pair in value] if name == "filters" else value
        return options

    @classmethod
    def from_file(cls, path: str | Path) -> BiLMOptions:
        """Read an options.json file."""
        options = read_json(path, "options file")  # size-bounded; a byte-order mark dropped
        return cls.from_dict(options, source=f"options file {path}")

    def n_parameters(self) -> int:
        """Number of parameters in the bilm-tf weights file (docs/MODEL.md §3.4)."""
        e, f, p, d = self.char_embedding_dim, self.n_filters, self.projection_dim, self.lstm_dim
        count = (self.n_characters - 1) * e + sum(w * e * n + n for w, n in self.filters)
        count += self.n_highway * 2 * (f * f + f)
        count += max(self.n_words - 1, 0) * self.word_embedding_dim
        if self.has_char_projection:
            count += (f + self.word_embedding_dim) * p + p
        per_cell = 2 * p * 4 * d + 4 * d + (d * p if self.has_lstm_projection else 0)
        return count + 2 * self.n_layers * per_cell


def _read_field(options: dict[str, Any], key: str, kind: Any, default: Any, source: str) -> Any:
    """The value of `key` ("section.name", "section.object.name") checked as its `kind` says
    (FIELDS); absent or null: `default`."""
    *parents, name = key.split(".")
    holder = options
    for depth, part in enumerate(parents):
        holder = holder.get(part) or {}
        if not isinstance(holder, dict):
            where = ".".join(parents[: depth + 1])
            raise ValueError(f"{source}: '{where}' must be an object, got {holder!r}")
    value = holder.get(name)
    if value is None:
        if default is REQUIRED:
            raise ValueError(f"{source}: missing required key '{key}'")
        return default
    if isinstance(kind, tuple):
        if value not in kind:
            raise ValueError(f"{source}: '{key}' is {value!r}; expected one of {kind}")
        return value
    if kind == "flag":
        if value in (0, 1) and not isinstance(value, str):  # bools, and 0/1 as written
            return bool(value)
        raise ValueError(f"{source}: '{key}' must be true or false, got {value!r}")
    if kind == "clip":  # bilm-tf and AllenNLP only clip when the value is truthy
        if value is False:
            return None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"{source}: '{key}' must be a number or null, got {value!r}")
        return float(value) or None
    if kind == "filters":
        pairs = isinstance(value, (list, tuple)) and all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in value
        )
        if not pairs or not value:
            raise ValueError(
                f"{source}: '{key}' must be a list of [width, n_filters] pairs, got {value!r}"
            )
        filters = tuple((_integer(key, w, source), _integer(key, n, source)) for w, n in value)
        for width, n in filters:
            if not 1 <= width <= MAX_CHARS_PER_TOKEN or n < 1:
                raise ValueError(f"{source}: bad filter [{width}, {n}] in '{key}'")
        return filters
    value = _integer(key, value, source)
    if value < kind:
        raise ValueError(f"{source}: '{key}' must be at least {kind}, got {value}")
    return value


def _integer(key: str, value: Any, source: str) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{source}: '{key}' must be an integer, got {value!r}")
    return value
