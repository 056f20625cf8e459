"""Training text: find input files, tokenise them once into a cache (a sentence a line, tokens
between single spaces) and stream batches from it, a pure function of (seed, cache)."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import chain, count, islice, zip_longest
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal, Optional, Sequence

from ..description.chars import batches_by_padded_tokens
from ..util.files import atomic_path, write_text
from .config import PretrainConfig

logger = logging.getLogger("spacy_elmo.pretrain")

TEXT_PROBE_BYTES = 8192  # a file whose first bytes are not text is skipped whole
# Read with errors="surrogateescape", a byte that is not UTF-8 becomes one of U+DC80..U+DCFF
# (which UTF-8 text cannot hold): a line holding one of them or a NUL is not text.
_NOT_TEXT = re.compile("[\x00\udc80-\udcff]")
# Longer lines are read in pieces cut at whitespace (with a warning naming file and line): a
# line is never held whole, and spaCy's `max_length` (1,000,000 characters) is never reached.
MAX_LINE_CHARS = 100_000
# A run's tokenised training and held-out text, and its input lines that were not text
TRAIN, DEV, SKIPPED = "corpus/train.txt", "corpus/dev.txt", "corpus/skipped.json"
Splitter = Callable[[Iterable[str]], Iterator[list[str]]]  # lines -> sentences of tokens


def iter_input_files(inputs: Sequence[str | Path], refuse_binary: bool = False) -> list[Path]:
    """The text files of `inputs` (folders recursively, sorted); empty and binary files are
    skipped with a warning, or binary ones refused (`refuse_binary`)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            candidates = [path]
        else:
            raise FileNotFoundError(f"pretraining input {path} does not exist")
        for candidate in candidates:
            reason = _unusable_reason(candidate)
            if reason and refuse_binary and reason != "empty file":
                raise ValueError(f"input {candidate}: {reason}")
            if reason:
                logger.warning("skipping %s: %s", candidate, reason)
            else:
                files.append(candidate)
    return files


def _unusable_reason(path: Path) -> str | None:
    if path.stat().st_size == 0:
        return "empty file"
    with path.open("rb") as handle:
        probe = handle.read(TEXT_PROBE_BYTES)
    if b"\x00" in probe:
        return "binary file (NUL bytes)"
    try:
        probe.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(probe) - 4:  # not just a character cut by the probe's end
            return f"not UTF-8 text (byte {err.start})"
    return None


@dataclass
class SkippedLines:
    """Lines that were not text (bytes that are not UTF-8, NUL), counted by file."""

    by_file: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        lines = sum(self.by_file.values())
        return {"skipped_lines": lines, "skipped_by_file": dict(self.by_file)}


def iter_lines(
    files: Iterable[Path],
    max_chars: int = MAX_LINE_CHARS,
    not_text: Literal["skip", "refuse"] = "skip",
    skipped: Optional[SkippedLines] = None,
) -> Iterator[str]:
    """The non-blank lines of text files, a leading byte-order mark dropped; a line that is not
    text is skipped (one warning a file, counted in `skipped`) or refused (`not_text="refuse"`),
    and one over `max_chars` characters comes in pieces cut at whitespace, with a warning."""
    for path in files:
        count, first = 0, ""
        for number, line in _read_lines(path, max_chars):
            bad = _NOT_TEXT.search(line)
            if bad is not None:
                what = _byte_name(bad.group())
                where = f"{path}, line {number}: {what} at character {bad.start() + 1}"
                if not_text == "refuse":
                    raise ValueError(f"{where}; the input must be UTF-8 text")
                count, first = count + 1, first or where
                continue
            line = line.strip()
            if line:
                yield line
        if count:
            logger.warning(
                "%s: skipped %d line(s) that are not UTF-8 text; the first: %s", path, count, first
            )
            if skipped is not None:
                skipped.by_file[str(path)] = skipped.by_file.get(str(path), 0) + count


def _byte_name(char: str) -> str:
    """The byte behind a character of _NOT_TEXT."""
    if char == "\x00":
        return "a NUL byte"
    return f"byte 0x{ord(char) - 0xDC00:02x}, which is not UTF-8,"


def _read_lines(path: Path, max_chars: int) -> Iterator[tuple[int, str]]:
    """(line number, line or piece of a long line), undecodable bytes as surrogates."""
    with path.open("r", encoding="utf-8-sig", errors="surrogateescape") as handle:
        for number, piece in enumerate(iter(lambda: handle.readline(max_chars + 1), ""), 1):
            if piece.endswith("\n") or len(piece) <= max_chars:
                yield number, piece  # the whole line
                continue
            message = "%s, line %d: longer than %d characters; split at whitespace"
            logger.warning(message, path, number, max_chars)
            text = piece
            while True:  # the rest of the long line, never more than 2 * max_chars held
                piece = handle.readline(max_chars)
                text += piece
                while len(text) > max_chars:
                    head, text = _cut(text, max_chars)
                    yield number, head
                if not piece or piece.endswith("\n"):
                    break
            yield number, text


def _cut(text: str, max_chars: int) -> tuple[str, str]:
    """`text` cut at its last whitespace within `max_chars` characters (else at `max_chars`)."""
    space = max(text.rfind(" ", 0, max_chars + 1), text.rfind("\t", 0, max_chars + 1))
    if space > 0:
        return text[:space], text[space + 1 :]
    return text[:max_chars], text[max_chars:]


def spacy_sentence_splitter(lang: str, pipeline: Optional[str]) -> Splitter:
    """Sentences of tokens from raw lines: by a spaCy `pipeline` (name or directory), else by
    `lang`'s blank tokenizer and the sentencizer."""
    import spacy

    try:
        nlp = spacy.load(pipeline) if pipeline is not None else spacy.blank(lang)
    except (ImportError, OSError, ValueError, KeyError) as err:
        what = f"pipeline {pipeline!r}: not an installed spaCy pipeline or a pipeline directory"
        if pipeline is None:
            what = f"lang {lang!r}: not a language spaCy has (or its extra package is missing)"
        reason = str(err).splitlines()[0] if str(err) else repr(err)
        raise ValueError(f"{what} ({reason})") from None
    if not any(nlp.has_pipe(name) for name in ("sentencizer", "senter", "parser")):
        nlp.add_pipe("sentencizer")

    def split(lines: Iterable[str]) -> Iterator[list[str]]:
        for doc in nlp.pipe(lines, batch_size=256):
            for sent in doc.sents:
                tokens = [t.text for t in sent if not t.is_space]
                if tokens:
                    yield tokens

    return split


def pretokenized_splitter(lines: Iterable[str]) -> Iterator[list[str]]:
    """Input that is already one tokenised sentence per line."""
    for line in lines:
        tokens = line.split()
        if tokens:
            yield tokens


def sentence_splitter(pretokenized: bool, lang: str, pipeline: Optional[str]) -> Splitter:
    """Whitespace tokens a line (`pretokenized`), else `spacy_sentence_splitter`'s sentences."""
    return pretokenized_splitter if pretokenized else spacy_sentence_splitter(lang, pipeline)


def cut_sentences(sentences: Iterable[list[str]], max_tokens: int) -> Iterator[list[str]]:
    """`sentences`, each longer one cut into pieces of `max_tokens` tokens (the last shorter)."""
    for tokens in sentences:
        for start in range(0, len(tokens), max_tokens):
            yield tokens[start : start + max_tokens]


def write_tokenized(
    files: Sequence[Path],
    output: Path,
    splitter: Splitter,
    max_tokens: int,
    dev_output: Path | None = None,
    dev_every: int = 0,
    skipped: Optional[SkippedLines] = None,
) -> tuple[int, int]:
    """Tokenise `files` into `output` atomically, sentences cut at `max_tokens`, every
    `dev_every`-th to `dev_output` when given; (sentences, tokens) written to `output`."""
    n_sentences = n_tokens = n_seen = n_dev = 0
    with ExitStack() as stack:
        tmp = stack.enter_context(atomic_path(output))
        out = stack.enter_context(tmp.open("w", encoding="utf-8"))
        dev_out = None
        if dev_output is not None:
            dev_tmp = stack.enter_context(atomic_path(dev_output))
            dev_out = stack.enter_context(dev_tmp.open("w", encoding="utf-8"))
        sentences = splitter(iter_lines(files, skipped=skipped))
        for n_seen, tokens in enumerate(cut_sentences(sentences, max_tokens), 1):
            line = " ".join(tokens) + "\n"
            if dev_out is not None and dev_every and n_seen % dev_every == 0:
                dev_out.write(line)
                n_dev += 1
                continue
            out.write(line)
            n_sentences += 1
            n_tokens += len(tokens)
        names = ", ".join(str(f) for f in files[:5]) or "(no usable files)"
        if n_sentences == 0:
            raise ValueError(f"the pretraining corpus has no sentences: {names}")
        if dev_out is not None and n_dev == 0:
            raise ValueError(
                f"the held-out split is empty: the corpus ({names}) has {n_seen} sentences, "
                f"fewer than one held-out sentence every {dev_every} (dev_every); give held-out "
                f"text (dev) or more text"
            )
    return n_sentences, n_tokens


def read_sentences(path: Path) -> Iterator[list[str]]:
    """Sentences of a tokenised cache file."""
    with path.open("r", encoding="utf-8") as handle:
        for line in handle:
            tokens = _tokens(line)
            if tokens:
                yield tokens


def _tokens(line: str) -> list[str]:
    """The tokens of a cache line (between single spaces); none for a blank line."""
    line = line.rstrip("\n")
    return line.split(" ") if line else []


def spread_sample(path: Path, n: int) -> list[list[str]]:
    """At most about `n` sentences of `path`, every k-th from the first."""
    total = sum(1 for _ in read_sentences(path))
    stride = max(1, -(-total // n))
    return [s for i, s in enumerate(read_sentences(path)) if i % stride == 0]


def interleaved_sentences(path: Path, n_streams: int = 64) -> Iterator[list[str]]:
    """Sentences of `path` read round-robin from `n_streams` equal byte ranges, so that a file
    written corpus after corpus yields a mixture of them from the start, still streaming."""
    size = path.stat().st_size
    starts = sorted({_line_start(path, size * i // n_streams) for i in range(n_streams)})
    streams = [_lines_between(path, start, end) for start, end in zip(starts, [*starts[1:], size])]
    for line in chain.from_iterable(zip_longest(*streams, fillvalue=b"")):
        tokens = _tokens(line.decode("utf-8"))
        if tokens:
            yield tokens


def _line_start(path: Path, offset: int) -> int:
    """The offset of the first line starting at or after `offset`."""
    if offset == 0:
        return 0
    with path.open("rb") as handle:
        handle.seek(offset - 1)
        handle.readline()  # the rest of the line holding byte offset - 1
        return handle.tell()


def _lines_between(path: Path, start: int, end: int) -> Iterator[bytes]:
    """The lines of `path` that start in [start, end), `start` being a line's start."""
    with path.open("rb") as handle:
        handle.seek(start)
        for line in iter(handle.readline, b""):
            yield line
            if handle.tell() >= end:
                break


def iter_batches(path: Path, seed: int, batch_tokens: int) -> Iterator[tuple[int, list[list[str]]]]:
    """An endless, deterministic stream of (epoch, batch) over the tokenised file: each chunk of
    20,000 sentences shuffled by (seed, epoch, chunk), sorted by length, cut into batches of at
    most `batch_tokens` tokens (boundaries included) and 512 sentences, the batches shuffled."""
    if next(read_sentences(path), None) is None:
        raise ValueError(f"tokenised corpus {path} holds no sentences")
    for epoch in count():
        sentences = interleaved_sentences(path)
        for chunk_index, chunk in enumerate(_chunks(sentences, 20_000)):
            digest = hashlib.sha256(f"{seed}/{epoch}/{chunk_index}".encode()).digest()
            rng = random.Random(int.from_bytes(digest[:8], "little"))
            rng.shuffle(chunk)
            chunk.sort(key=len)
            batches = list(batches_by_padded_tokens(chunk, batch_tokens, max_items=512))
            rng.shuffle(batches)
            for batch in batches:
                yield epoch, batch


def _chunks(items: Iterator[list[str]], size: int) -> Iterator[list[list[str]]]:
    """Lists of `size` items (the last one shorter) until `items` ends."""
    while chunk := list(islice(items, size)):
        yield chunk


def prepare_corpus(config: PretrainConfig, work: Path) -> None:
    """Tokenise the inputs once into work/corpus/{train,dev}.txt (skipped when present)."""
    train, dev = work / TRAIN, work / DEV
    if train.exists() and dev.exists():
        return
    splitter = sentence_splitter(config.pretokenized, config.lang, config.pipeline)
    files = iter_input_files(config.inputs)
    if not files:
        raise ValueError(f"no usable text files in {', '.join(config.inputs)}")
    skipped = SkippedLines()  # lines that are not text: warned about, counted in the summary
    limit = config.max_sentence_tokens
    if config.dev:
        dev_files = iter_input_files(config.dev)
        write_tokenized(files, train, splitter, limit, skipped=skipped)
        write_tokenized(dev_files, dev, splitter, limit, skipped=skipped)
    else:
        write_tokenized(files, train, splitter, limit, dev, config.dev_every, skipped=skipped)
    write_text(work / SKIPPED, json.dumps(skipped.to_dict(), indent=2) + "\n")
