"""The JSON files that describe a biLM (options.json, config.json, the ELMoForManyLangs
architecture, lexicon.json), parsed by srsly. At most a bound is read (not a size asked of
`stat`, which a FIFO lacks), and a larger file is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import srsly

# A description of a biLM (options.json, config.json, the architecture JSON) is a few hundred
# bytes; a dictionary of words (lexicon.json) a few megabytes.
MAX_DESCRIPTION_BYTES = 1 << 20
MAX_LEXICON_BYTES = 256 << 20


class MissingFileError(FileNotFoundError, ValueError):
    """A weights or options file that does not exist (both a FileNotFoundError and a ValueError)."""


def read_json(path: str | Path, what: str, max_bytes: int = MAX_DESCRIPTION_BYTES) -> Any:
    """The JSON value in `path` (UTF-8, a leading byte-order mark dropped). `what` names the
    file in errors ("options file"): MissingFileError when it does not exist, ValueError when
    it is larger than `max_bytes`, unreadable, not UTF-8 or not JSON."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(2, f"{what} does not exist", str(path))
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as err:
        raise ValueError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise ValueError(
            f"{what} {path} is larger than the {max_bytes:,} bytes that spacy-elmo reads for "
            "it; is it the right file?"
        )
    try:
        return srsly.json_loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{what} {path} is not valid JSON (not UTF-8 text: {err})") from None
    except ValueError as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None
