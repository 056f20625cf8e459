"""Bulk embedding of a text file into hdf5, in the layout of the old `allennlp elmo` command."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy

from ..bilm import BiLM
from ..util.files import atomic_path, check_output
from ..util.signals import deferred
from .engine import check_positive

OUTPUT_FORMATS = ("all", "top", "average")
# Longer lines run as consecutive windows of this many tokens, each a sentence of its own for
# the biLM; the line's dataset holds the windows' vectors concatenated.
MAX_TOKENS = 256
COMPRESSIONS = ("gzip", "lzf")
CHUNK_LINES = 1024  # lines read, tokenised and embedded at a time


@dataclass(frozen=True)
class LineRange:
    """Lines `first` .. `first + count - 1` (0-based) of a file, starting at byte `offset`."""

    first: int
    offset: int
    count: int


def read_lines(
    path: Path, lines: Optional[LineRange] = None, name: Optional[str] = None
) -> Iterator[str]:
    """Stream the lines of a UTF-8 text file (see `decode_line`); with `lines`, only that range,
    read from its byte offset. `name`: what messages call the file, where it is a copy of what
    the user gave ("standard input")."""
    where = name or f"input file {path}"
    if not path.is_file():
        raise FileNotFoundError(f"{where} does not exist or is not a file")
    with path.open("rb") as handle:
        handle.seek(lines.offset if lines else 0)
        raws = islice(handle, lines.count if lines else None)
        for number, raw in enumerate(raws, start=(lines.first if lines else 0) + 1):
            yield decode_line(raw, number, where).rstrip("\r\n")


def decode_line(raw: bytes, number: int, where: str) -> str:
    """Line `number` of a file as text, a byte-order mark at the start of the file dropped;
    ValueError naming `where` and the line if it is not UTF-8 or holds a NUL byte (binary)."""
    if number == 1:
        raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{where}, line {number}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    if "\x00" in text:
        raise ValueError(
            f"{where}, line {number}: not UTF-8 text (a NUL byte at character "
            f"{text.index(chr(0)) + 1})"
        )
    return text


def whitespace_tokenizer(line: str) -> list[str]:
    """Pre-tokenised input: tokens are separated by whitespace."""
    return line.split()


# Tokens that a tokenizer would have split: punctuation stuck to a word, a contraction, a
# sentence-final period on the last word of a line ("office."; "U.S." is left alone).
_RAW_TOKEN = re.compile(
    r"\w[,;:!?\"')\]]$|^[\"'(\[]\w|\w(n't|'s|'re|'ve|'ll|'d|'m)$", re.IGNORECASE
)
_FINAL_PERIOD = re.compile(r"^[^.]*\w{2}\.$")


def raw_looking_token(
    path: Path, max_lines: int = 1000, name: Optional[str] = None
) -> Optional[tuple[int, str]]:
    """The first (line number, token) among the first `max_lines` lines of `path` that looks
    like untokenised text, or None."""
    for number, line in enumerate(islice(read_lines(path, name=name), max_lines), start=1):
        tokens = line.split()
        for token in tokens:
            if len(token) > 1 and _RAW_TOKEN.search(token):
                return number, token
        if tokens and _FINAL_PERIOD.match(tokens[-1]):
            return number, tokens[-1]
    return None


def spacy_tokenizer(
    lang: Optional[str] = "en", pipeline: Optional[str] = None
) -> Callable[[str], list[str]]:
    """The tokens of a raw line by spaCy, whitespace tokens dropped: the tokenizer of `pipeline`
    (an installed package or a folder) when one is named, else `lang`'s rule-based one (en)."""
    import spacy

    tokenizer = (spacy.load(pipeline) if pipeline else spacy.blank(lang or "en")).tokenizer
    return lambda line: [token.text for token in tokenizer(line) if not token.is_space]


def embed_file(
    bilm: BiLM,
    input_path: str | Path,
    output_path: str | Path,
    output_format: str = "all",
    batch_size: int = 64,
    tokenize: Callable[[str], list[str]] = whitespace_tokenizer,
    progress: bool = True,
    max_tokens: int = MAX_TOKENS,
    float16: bool = False,
    compression: Optional[str] = None,
    lines: Optional[LineRange] = None,
    input_name: Optional[str] = None,
) -> int:
    """Embed every line of `input_path` into `output_path` (atomically); return the lines.

    Dataset `str(i)` holds line i: (L + 1, n, D) for "all", (n, D) for "top" and "average";
    `sentence_to_index` maps each line's text to its index, as a JSON string. With `lines`, only
    that range, its datasets keeping their numbers in the whole file. `input_name`: what
    messages call the input where it is a copy ("standard input").
    """
    from tqdm import tqdm

    storage = dataset_options(float16, compression, output_format, max_tokens)
    dtype = storage.pop("dtype")
    input_path, output_path = Path(input_path), Path(output_path)
    check_output(output_path, [input_path])
    if lines is not None:
        first, total = lines.first, lines.count
    else:
        first, total = 0, sum(1 for _ in read_lines(input_path, name=input_name))
    texts = read_lines(input_path, lines, input_name)
    sentence_to_index: dict[str, str] = {}
    with (
        atomic_path(output_path) as tmp,
        hdf5_written(tmp) as out,
        tqdm(total=total, unit="line", disable=not progress, desc="embedding") as bar,
    ):
        index = first
        while chunk := list(islice(texts, CHUNK_LINES)):
            windows = [_windows(tokenize(line), max_tokens) for line in chunk]
            vectors = iter(bilm.embed([w for line in windows for w in line], batch_size=batch_size))
            with deferred():  # see `hdf5_written`
                for line, line_windows in zip(chunk, windows):
                    pieces = [next(vectors) for _ in line_windows]
                    layers = pieces[0] if len(pieces) == 1 else numpy.concatenate(pieces, axis=1)
                    data = _select(layers, output_format).astype(dtype, copy=False)
                    # an empty line's (.., 0, D) array cannot be chunked, so not compressed
                    options = storage if data.size else {}
                    out.create_dataset(str(index), data=data, **options)
                    sentence_to_index.setdefault(line, str(index))
                    index += 1
            bar.update(len(chunk))
        with deferred():
            write_sentence_to_index(out, sentence_to_index)
    return index - first


@contextmanager
def hdf5_written(path: Path) -> Iterator:
    """An h5py file at `path`, created and in the end closed with stop signals deferred.

    h5py frees its objects through weakref callbacks, and a `Stopped` that a signal raises
    inside one is lost (Python prints it and goes on): its users defer signals around their
    writes too, so that a stop is raised between them.
    """
    import h5py

    with deferred():
        out = h5py.File(path, "w")
    try:
        yield out
    finally:
        with deferred():
            out.close()


def dataset_options(
    float16: bool = False,
    compression: Optional[str] = None,
    output_format: str = "all",
    max_tokens: int = MAX_TOKENS,
) -> dict:
    """Check the options of `embed_file`; h5py `create_dataset` keywords (and "dtype")."""
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output_format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
    check_positive(max_tokens=max_tokens)
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(
            f"compression must be one of {', '.join(map(repr, COMPRESSIONS))} (or None: not "
            f"compressed), got {compression!r}"
        )
    options: dict = {"dtype": numpy.float16 if float16 else numpy.float32}
    if compression is not None:
        options.update(compression=compression, shuffle=True)
    if compression == "gzip":
        options["compression_opts"] = 4
    return options


def write_sentence_to_index(out, sentence_to_index: dict[str, str]) -> None:
    """The `sentence_to_index` dataset: one JSON string, line text -> first index."""
    import h5py

    mapping = out.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))
    mapping[0] = json.dumps(sentence_to_index, ensure_ascii=False)


def _windows(tokens: list[str], max_tokens: int) -> list[list[str]]:
    """Consecutive windows of at most `max_tokens` tokens; one (empty) for an empty line."""
    return [tokens[i : i + max_tokens] for i in range(0, max(len(tokens), 1), max_tokens)]


def _select(layers: numpy.ndarray, output_format: str) -> numpy.ndarray:
    if output_format == "top":
        return layers[-1]
    if output_format == "average":
        return layers.mean(axis=0)
    return layers
