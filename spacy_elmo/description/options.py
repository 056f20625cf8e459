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

        def get(section: str, key: str, default: Any = KeyError) -> Any:
            value = options[section].get(key, default)  # both sections are dicts (below)
            if value is KeyError:
                raise ValueError(f"{source}: missing required key '{section}.{key}'")
            return value

        def integer(key: str, value: Any) -> int:
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{source}: '{key}' must be an integer, got {value!r}")
            return value

        def flag(key: str, value: Any) -> bool:
            if value in (0, 1) and not isinstance(value, str):  # bools, and 0/1 as written
                return bool(value)
            raise ValueError(f"{source}: '{key}' must be true or false, got {value!r}")

        if not isinstance(options, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(options).__name__}")
        for section in ("char_cnn", "lstm"):
            if not isinstance(options.get(section), dict):
                found = "" if section not in options else f", got {options[section]!r}"
                raise ValueError(f"{source}: missing the '{section}' object{found}")
        embedding = get("char_cnn", "embedding")
        if not isinstance(embedding, dict) or "dim" not in embedding:
            raise ValueError(f"{source}: missing required key 'char_cnn.embedding.dim'")
        raw_filters = get("char_cnn", "filters")
        if not isinstance(raw_filters, (list, tuple)) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in raw_filters
        ):
            raise ValueError(
                f"{source}: 'char_cnn.filters' must be a list of [width, n_filters] pairs, "
                f"got {raw_filters!r}"
            )
        filters = tuple(
            (integer("char_cnn.filters", w), integer("char_cnn.filters", n)) for w, n in raw_filters
        )
        max_chars = get("char_cnn", "max_characters_per_token", MAX_CHARS_PER_TOKEN)
        if max_chars != MAX_CHARS_PER_TOKEN:
            raise ValueError(
                f"{source}: 'char_cnn.max_characters_per_token' is {max_chars}; ELMo's "
                f"character mapping has exactly {MAX_CHARS_PER_TOKEN} slots"
            )
        char_vocabulary = get("char_cnn", "char_vocabulary", "bytes")  # checked by `validate`
        n_characters = get("char_cnn", "n_characters", N_CHARACTERS)
        word_embedding: Any = {}
        if char_vocabulary == "dictionary":
            n_characters = integer("char_cnn.n_characters", n_characters)
            word_embedding = get("char_cnn", "word_embedding", {})
            if not isinstance(word_embedding, dict):
                raise ValueError(
                    f"{source}: 'char_cnn.word_embedding' must be an object with 'dim' and "
                    f"'n_words', got {word_embedding!r}"
                )
        elif n_characters not in (N_CHARACTERS - 1, N_CHARACTERS):
            raise ValueError(
                f"{source}: 'char_cnn.n_characters' is {n_characters}; expected "
                f"{N_CHARACTERS} (or {N_CHARACTERS - 1} as written during training)"
            )
        known = {
            "char_cnn": {
                "embedding",
                "filters",
                "n_highway",
                "activation",
                "max_characters_per_token",
                "n_characters",
                "char_vocabulary",
                "word_embedding",
            },
            "lstm": {
                "dim",
                "projection_dim",
                "n_layers",
                "cell_clip",
                "proj_clip",
                "use_skip_connections",
            },
        }
        extra = {k: v for k, v in options.items() if k not in known}
        for section, keys in known.items():
            leftovers = {k: v for k, v in options[section].items() if k not in keys}
            if leftovers:
                extra[section] = leftovers
        activation = get("char_cnn", "activation", "relu")
        if not isinstance(activation, str):
            raise ValueError(
                f"{source}: 'char_cnn.activation' must be a string, got {activation!r}"
            )
        parsed = cls(
            char_embedding_dim=integer("char_cnn.embedding.dim", embedding["dim"]),
            filters=filters,
            n_highway=integer("char_cnn.n_highway", get("char_cnn", "n_highway", 0) or 0),
            activation=activation,
            lstm_dim=integer("lstm.dim", get("lstm", "dim")),
            projection_dim=integer("lstm.projection_dim", get("lstm", "projection_dim")),
            n_layers=integer("lstm.n_layers", get("lstm", "n_layers", 1)),
            cell_clip=_optional_clip(get("lstm", "cell_clip", None), "lstm.cell_clip", source),
            proj_clip=_optional_clip(get("lstm", "proj_clip", None), "lstm.proj_clip", source),
            use_skip_connections=flag(
                "lstm.use_skip_connections", get("lstm", "use_skip_connections", False)
            ),
            extra=copy.deepcopy(extra),
            char_vocabulary=char_vocabulary,
            n_characters=n_characters if char_vocabulary == "dictionary" else N_CHARACTERS,
            word_embedding_dim=integer("char_cnn.word_embedding.dim", word_embedding.get("dim", 0)),
            n_words=integer("char_cnn.word_embedding.n_words", word_embedding.get("n_words", 0)),
        )
        parsed.validate(source)
        return parsed

    def validate(self, source: str = "options") -> None:
        """Raise ValueError when a value cannot describe a working biLM."""
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"{source}: 'char_cnn.activation' is {self.activation!r}; "
                f"expected one of {ACTIVATIONS}"
            )
        if not self.filters:
            raise ValueError(f"{source}: 'char_cnn.filters' is empty")
        for width, n in self.filters:
            if not 1 <= width <= MAX_CHARS_PER_TOKEN or n < 1:
                raise ValueError(f"{source}: bad filter [{width}, {n}] in 'char_cnn.filters'")
        positive = {
            "char_cnn.embedding.dim": self.char_embedding_dim,
            "lstm.dim": self.lstm_dim,
            "lstm.projection_dim": self.projection_dim,
            "lstm.n_layers": self.n_layers,
        }
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"{source}: '{key}' must be positive, got {value}")
        if self.projection_dim > self.lstm_dim:
            raise ValueError(
                f"{source}: 'lstm.projection_dim' ({self.projection_dim}) is larger than "
                f"'lstm.dim' ({self.lstm_dim})"
            )
        if self.n_highway < 0:
            raise ValueError(f"{source}: 'char_cnn.n_highway' is negative")
        if self.char_vocabulary not in CHAR_VOCABULARIES:
            raise ValueError(
                f"{source}: 'char_cnn.char_vocabulary' is {self.char_vocabulary!r}; expected one "
                f"of {CHAR_VOCABULARIES}"
            )
        if self.char_vocabulary == "dictionary":
            if self.n_characters < 2:
                raise ValueError(
                    f"{source}: 'char_cnn.n_characters' must be at least 2, got {self.n_characters}"
                )
            if self.word_embedding_dim < 0 or self.n_words < 0:
                raise ValueError(f"{source}: 'char_cnn.word_embedding' has a negative size")
            if (self.word_embedding_dim > 0) != (self.n_words > 0):
                raise ValueError(
                    f"{source}: 'char_cnn.word_embedding' needs both 'dim' and 'n_words' "
                    f"(got dim {self.word_embedding_dim}, n_words {self.n_words})"
                )
        elif self.word_embedding_dim or self.n_words or self.n_characters != N_CHARACTERS:
            raise ValueError(
                f"{source}: a word embedding and a character table of other than "
                f"{N_CHARACTERS} rows need 'char_cnn.char_vocabulary': 'dictionary'"
            )

    def to_dict(self) -> dict[str, Any]:
        """The options.json dictionary (bilm-tf keys)."""
        options: dict[str, Any] = copy.deepcopy(
            {k: v for k, v in self.extra.items() if k not in ("char_cnn", "lstm")}
        )
        options["lstm"] = {
            **copy.deepcopy(self.extra.get("lstm", {})),
            "dim": self.lstm_dim,
            "projection_dim": self.projection_dim,
            "n_layers": self.n_layers,
            "use_skip_connections": self.use_skip_connections,
        }
        for key in ("cell_clip", "proj_clip"):
            if getattr(self, key) is not None:
                options["lstm"][key] = getattr(self, key)
        options["char_cnn"] = {
            **copy.deepcopy(self.extra.get("char_cnn", {})),
            "embedding": {"dim": self.char_embedding_dim},
            "filters": [list(f) for f in self.filters],
            "n_highway": self.n_highway,
            "activation": self.activation,
            "n_characters": N_CHARACTERS,
            "max_characters_per_token": MAX_CHARS_PER_TOKEN,
        }
        if self.char_vocabulary == "dictionary":
            options["char_cnn"]["char_vocabulary"] = self.char_vocabulary
            options["char_cnn"]["n_characters"] = self.n_characters
            if self.word_embedding_dim:
                options["char_cnn"]["word_embedding"] = {
                    "dim": self.word_embedding_dim,
                    "n_words": self.n_words,
                }
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


def _optional_clip(value: Any, key: str, source: str) -> float | None:
    """bilm-tf and AllenNLP only clip when the value is truthy."""
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{source}: '{key}' must be a number or null, got {value!r}")
    return float(value) if value else None
