#!/usr/bin/env python
"""Turn the fetched corpora (see fetch_assets.py) into UTF-8 plain text, one unit a line.

Each extractor reads ``ASSETS/NAME/`` and yields paragraphs or sentences without markup:

* ``sotu``: State of the Union addresses (``data/*.txt``), split into sentences.
* ``nlp_corpus``: nlp-corpus ``builds/doc-N.json`` string arrays, one string a line.
* ``brown``: Brown corpus, ``word/tag`` tags stripped, one tokenised sentence a line.
* ``linux_doc``: Linux kernel docs ``html/_sources/**/*.rst.txt``, prose paragraphs only.
* ``web_bible``: World English Bible from the SWORD zText module, one verse or paragraph a line.
* ``austen``: Jane Austen's six novels from R's lazy-load ``data/Rdata.rdb``, one paragraph a line.
* ``moby_dick``: Moby Dick chapter files, one paragraph a line.
* ``reuters21578``: Reuters-21578 story bodies (``data/full/reuters-*.json``), one paragraph a
  line, without the closing "Reuter" signature (1987 newswire; CoNLL-2003 is 1996-97 Reuters).
* ``conll2003``: the CoNLL-2003 TRAIN split only, one sentence a line (never valid/test).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import struct
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from workflow.conll import sentence_words
from workflow.rdata import STRSXP, RDataError, RObject, read_lazyload_index, read_lazyload_value

# ---------------------------------------------------------------------------------------------
# Shared helpers


class ExtractError(RuntimeError):
    """An input file is missing or not in the expected format."""


_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Collapse all whitespace runs to single spaces and strip the ends."""
    return _SPACES.sub(" ", text).strip()


def _files(root: Path, pattern: str) -> list[Path]:
    """All files under ``root`` matching a recursive glob, sorted; error if there are none."""
    found = sorted(p for p in root.rglob(pattern) if p.is_file())
    if not found:
        raise ExtractError(f"no files matching {pattern!r} under {root}")
    return found


def _natural_key(path: Path) -> list[Any]:
    """Sort key that orders ``doc-2`` before ``doc-10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def paragraphs(lines: Iterable[str]) -> Iterator[str]:
    """Join runs of non-blank lines into single-line paragraphs."""
    current: list[str] = []
    for line in lines:
        if line.strip():
            current.append(line.strip())
        elif current:
            yield " ".join(current)
            current = []
    if current:
        yield " ".join(current)


_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "gen", "hon", "messrs", "gov", "lt", "col",
    "capt", "no", "vs", "rev", "sen", "rep", "prof", "co", "inc", "ft", "mt", "art", "sec",
}  # fmt: skip
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split running text at sentence ends, not after common abbreviations or initials."""
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        words = text[start : match.start() + 1].split()
        last = words[-1].rstrip(".").lower() if words else ""
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()) or "." in last:
            continue  # "Mr. Smith", "J. Smith", "U.S. Government"
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


# ---------------------------------------------------------------------------------------------
# npm corpora


def extract_sotu(root: Path) -> Iterator[str]:
    """State of the Union addresses: each ``data/*.txt`` split into sentences."""
    for path in _files(root, "data/*.txt"):
        for para in paragraphs(path.read_text(encoding="utf-8").splitlines()):
            yield from split_sentences(normalize(para))


def _json_array_items(root: Path, pattern: str) -> Iterator[Any]:
    """The items of the JSON arrays in the files under ``root`` matching ``pattern``, the
    files in natural order (``doc-2`` before ``doc-10``)."""
    for path in sorted(_files(root, pattern), key=_natural_key):
        items = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise ExtractError(f"{path}: expected a JSON array, got {type(items).__name__}")
        yield from items


def extract_nlp_corpus(root: Path) -> Iterator[str]:
    """nlp-corpus: ``builds/doc-N.json`` arrays of strings, one string a line."""
    for item in _json_array_items(root, "builds/doc-*.json"):
        if isinstance(item, str):
            yield item


_BROWN_QUOTES = {"``": '"', "''": '"'}


def strip_brown_tags(line: str) -> str:
    """Turn a Brown ``word/tag word/tag`` line into space-joined words (quotes as ``"``)."""
    words = []
    for token in line.split():
        word, sep, _tag = token.rpartition("/")
        if not sep or not word:
            word = token  # untagged token: keep as is
        words.append(_BROWN_QUOTES.get(word, word))
    return " ".join(words)


def extract_brown(root: Path) -> Iterator[str]:
    """Brown corpus files ``ca01..cr09``: one tagged sentence a line, tags stripped."""
    files = [p for p in _files(root, "c*") if re.fullmatch(r"c[a-r]\d\d", p.name)]
    if not files:
        raise ExtractError(f"no Brown files ca01..cr09 under {root}")
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield strip_brown_tags(line)


def extract_moby_dick(root: Path) -> Iterator[str]:
    """Moby Dick: files in ``data/file_list.json`` order (no contents), one paragraph a line."""
    listing = _files(root, "data/file_list.json")[0]
    data_dir = listing.parent
    for name in json.loads(listing.read_text(encoding="utf-8")):
        if name == "contents.txt":
            continue
        path = data_dir / name
        if not path.is_file():
            raise ExtractError(f"{listing} lists {name} but {path} is missing")
        for para in paragraphs(path.read_text(encoding="utf-8").splitlines()):
            if not re.match(r"(CHAPTER \d+\.|ETYMOLOGY\.|EXTRACTS\.|Epilogue$)", para):
                yield para


_REUTER_SIGNATURE = re.compile(r"\s*\bREUTER\s*(\x03)?\s*$", re.I)
_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t]+|\s*\n)")  # a new line that is indented or blank
_TICKER = re.compile(r"\s*<[A-Z0-9.]+>")  # "Standard Oil <SRD>": the stock symbol goes
_BRACKETED_NAME = re.compile(r"<([^<>]+)>")  # "<Airbus Industrie>": the name stays


def reuters_paragraphs(body: str) -> list[str]:
    """A Reuters-21578 body as paragraphs: indented lines start one; the signature and the
    stock symbols in angle brackets go, bracketed company names lose their brackets."""
    body = _TICKER.sub("", body.replace("\x03", " "))
    body = _REUTER_SIGNATURE.sub("", _BRACKETED_NAME.sub(r"\1", body).rstrip())
    return [normalize(part) for part in _PARAGRAPH_BREAK.split(body) if part.strip()]


def extract_reuters21578(root: Path) -> Iterator[str]:
    """Reuters-21578: the bodies of ``data/full/reuters-NNN.json`` (arrays of stories)."""
    for story in _json_array_items(root, "data/full/reuters-*.json"):
        body = story.get("body") if isinstance(story, dict) else None
        if isinstance(body, str):
            yield from reuters_paragraphs(body)


# ---------------------------------------------------------------------------------------------
# Linux kernel documentation (reStructuredText sources)

_UNDERLINE = re.compile(r"^([=\-`:'\"~^_*+#<>.])\1{2,}\s*$")
_TABLE_LINE = re.compile(r"^\s*(\+[-=+]+\+?|\|.*\||={2,}( +={2,})+)\s*$")
_LIST_MARKER = re.compile(r"^([-*+•]|#\.|\d+[.)]|[a-zA-Z][.)]|\(\d+\)|\([a-z]\))\s+")
_ROLE = re.compile(r":[a-zA-Z0-9:_+-]+:`([^`<]*?)(?:\s*<[^>`]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>`]*>`__?")
_INTERPRETED = re.compile(r"`+([^`]+?)`+_{0,2}")
_EMPHASIS = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
_SUBST_REF = re.compile(r"\|([^|\s][^|]*)\|_{0,2}")
_CODEY = re.compile(r"[{};]|->|::|==|!=|&&|\|\||#include|/\*|\*/|\w\(\w")  # code, not names


def rst_inline_to_text(text: str) -> str:
    """Replace reST inline markup (roles, links, literals, emphasis) by its text."""
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _SUBST_REF.sub(r"\1", text)
    text = re.sub(r"(?<=\w)_(?=\s|[.,;:)]|$)", "", text)  # reference_
    text = re.sub(r"\\(.)", r"\1", text)
    text = re.sub(r"\s*::$", ":", text)
    return normalize(text)


def _looks_like_prose(text: str) -> bool:
    """Heuristic: enough words, mostly letters, starts like a sentence, little code."""
    words = text.split()
    if len(words) < 4 or not text[0].isupper():
        return False
    if text[-1] not in ".:!?)\"'":
        return False
    non_space = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in non_space)
    if letters < 0.8 * len(non_space):
        return False
    if "http://" in text or "https://" in text or "@" in text or "\ufffd" in text:
        return False
    return len(_CODEY.findall(text)) <= len(words) / 25


def _rst_blocks(text: str) -> Iterator[list[str]]:
    """Split reST source into blocks of consecutive non-blank lines."""
    block: list[str] = []
    for line in text.splitlines():
        if line.strip():
            block.append(line.rstrip())
        elif block:
            yield block
            block = []
    if block:
        yield block


def rst_prose(text: str) -> Iterator[str]:
    """Yield the prose paragraphs of a reST document as plain single-line text."""
    for block in _rst_blocks(text):
        lines = list(block)
        # Remove section titles: underline (and optional overline) plus the title line.
        for i in range(len(lines) - 1, -1, -1):
            if i < len(lines) and _UNDERLINE.match(lines[i]):
                start = i - 1 if i > 0 else i
                del lines[start : i + 1]
        if not lines:
            continue
        first = lines[0]
        if first[0].isspace():  # indented: literal block, block quote or directive body
            continue
        if first.startswith(("..", ":", "|", ">>>", "$ ", "# ")) or _TABLE_LINE.match(first):
            continue
        if _LIST_MARKER.match(first):
            continue
        if any(_TABLE_LINE.match(line) or line.startswith(".. ") for line in lines):
            continue
        prose = rst_inline_to_text(" ".join(line.strip() for line in lines))
        if prose and _looks_like_prose(prose):
            yield prose


def extract_linux_doc(root: Path) -> Iterator[str]:
    """Linux kernel docs: English prose paragraphs of ``html/_sources/**/*.rst.txt``."""
    for path in _files(root, "*.rst.txt"):
        if "translations" in path.relative_to(root).parts:
            continue  # Italian, Chinese, Japanese, Korean versions
        yield from rst_prose(path.read_text(encoding="utf-8", errors="replace"))


# ---------------------------------------------------------------------------------------------
# SWORD zText module (World English Bible)

_BZS = struct.Struct("<III")  # block: offset, compressed size, uncompressed size
_BZV = struct.Struct("<IIH")  # verse: block number, offset in block, size


def read_ztext(module_dir: Path, testament: str) -> Iterator[str]:
    """Yield the raw (OSIS) text of every non-empty entry of one zText testament, in order."""
    paths = [module_dir / f"{testament}.{ext}" for ext in ("bzs", "bzv", "bzz")]
    for path in paths:
        if not path.is_file():
            raise ExtractError(f"missing zText file {path}")
    bzs, bzv, bzz = (p.read_bytes() for p in paths)
    for path, data, rec in ((paths[0], bzs, _BZS), (paths[1], bzv, _BZV)):
        if len(data) % rec.size:
            raise ExtractError(f"{path}: size {len(data)} is not a multiple of {rec.size}")
    blocks = [_BZS.unpack_from(bzs, i) for i in range(0, len(bzs), _BZS.size)]
    cache: dict[int, bytes] = {}
    for i in range(0, len(bzv), _BZV.size):
        block_no, offset, size = _BZV.unpack_from(bzv, i)
        if size == 0:
            continue
        if block_no >= len(blocks):
            raise ExtractError(f"{paths[1]}: entry {i // _BZV.size} names block {block_no}")
        if block_no not in cache:
            cache.clear()  # entries are in block order; keep one block in memory
            start, csize, usize = blocks[block_no]
            try:
                raw = zlib.decompress(bzz[start : start + csize])
            except zlib.error as err:
                raise ExtractError(f"{paths[2]}: block {block_no} at {start}: {err}") from err
            if len(raw) != usize:
                raise ExtractError(
                    f"{paths[2]}: block {block_no} is {len(raw)} bytes, index says {usize}"
                )
            cache[block_no] = raw
        yield cache[block_no][offset : offset + size].decode("utf-8", errors="replace")


_OSIS_DROP = re.compile(r"<(note|title)\b[^>]*(?<!/)>.*?</\1>", re.S)
_OSIS_BREAK = re.compile(
    r'<(div|p|lg)\b[^>]*type="(x-p|paragraph)"[^>]*/?>|<p\b[^>]*>|</p>|<lb\b[^>]*>'
)
_TAG = re.compile(r"<[^>]*>")
_OPEN_TAG_AT_END = re.compile(r"<[^>]*$")


def osis_to_text(osis: str) -> list[str]:
    """Strip OSIS markup (dropping notes and titles); return paragraphs as single lines."""
    text = _OSIS_DROP.sub(" ", osis)
    text = _OSIS_BREAK.sub("\n", text)
    text = html.unescape(_TAG.sub("", text))
    out = []
    for part in text.split("\n"):
        line = re.sub(r"\s+([,.;:!?’”)])", r"\1", normalize(part))
        if line:
            out.append(line)
    return out


def extract_web_bible(root: Path) -> Iterator[str]:
    """World English Bible: every zText module under the assets, OT then NT."""
    for bzs in _files(root, "ot.bzs") + sorted(root.rglob("nt.bzs")):
        carry = ""  # a tag cut at an entry boundary continues in the next entry
        for entry in read_ztext(bzs.parent, bzs.stem):
            text = carry + entry
            cut = _OPEN_TAG_AT_END.search(text)
            carry, text = (text[cut.start() :], text[: cut.start()]) if cut else ("", text)
            yield from osis_to_text(text)


# ---------------------------------------------------------------------------------------------
# Jane Austen's novels: janeaustenr's R lazy-load database (read by rdata.py)

AUSTEN_BOOKS = (
    "sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
    "persuasion",
)  # fmt: skip


def read_austen_lines(data_dir: Path) -> dict[str, list[str]]:
    """Read the six novels' character vectors from ``Rdata.rdb``/``Rdata.rdx``."""
    rdx, rdb = data_dir / "Rdata.rdx", data_dir / "Rdata.rdb"
    index = read_lazyload_index(rdx)
    books = {}
    for name in AUSTEN_BOOKS:
        if name not in index:
            raise ExtractError(f"{rdx}: no variable {name!r} (has {sorted(index)})")
        value = read_lazyload_value(rdb, *index[name])
        if not isinstance(value, RObject) or value.sexptype != STRSXP:
            raise ExtractError(f"{rdb}: {name} is not a character vector")
        books[name] = [line or "" for line in value.value]
    return books


def novel_paragraphs(lines: list[str]) -> Iterator[str]:
    """Join a novel's text lines into paragraphs, dropping all-capitals headings."""
    for para in paragraphs(lines):
        if any(c.islower() for c in para) and not re.fullmatch(r"by Jane Austen", para):
            yield para


def extract_austen(root: Path) -> Iterator[str]:
    """Jane Austen's six novels from janeaustenr's lazy-load data, one paragraph a line."""
    data_dir = _files(root, "Rdata.rdx")[0].parent
    for lines in read_austen_lines(data_dir).values():
        yield from novel_paragraphs(lines)


# ---------------------------------------------------------------------------------------------
# CoNLL-2003 (train split only)


def conll_sentences(lines: Iterable[str]) -> Iterator[str]:
    """Yield CoNLL sentences (first column joined by spaces), skipping ``-DOCSTART-``."""
    for words in sentence_words(lines):
        yield " ".join(words)


def extract_conll2003(root: Path) -> Iterator[str]:
    """CoNLL-2003 training sentences only: the valid and test text must never be used."""
    path = root / "train.txt"
    if not path.is_file():
        raise ExtractError(f"missing {path} (run fetch_assets.py conll2003)")
    with path.open(encoding="utf-8") as f:
        yield from conll_sentences(f)


# ---------------------------------------------------------------------------------------------
# Command line

EXTRACTORS: dict[str, Callable[[Path], Iterator[str]]] = {
    "sotu": extract_sotu,
    "nlp_corpus": extract_nlp_corpus,
    "brown": extract_brown,
    "linux_doc": extract_linux_doc,
    "web_bible": extract_web_bible,
    "austen": extract_austen,
    "moby_dick": extract_moby_dick,
    "reuters21578": extract_reuters21578,
    "conll2003": extract_conll2003,
}
OUTPUT_NAMES = {"conll2003": "conll2003_train.txt"}


def write_lines(lines: Iterable[str], output: Path) -> tuple[int, int]:
    """Write normalised non-empty lines to ``output`` atomically; return (lines, words)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".part")
    n_lines = n_words = 0
    with tmp.open("w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            line = normalize(line)
            if line:
                f.write(line + "\n")
                n_lines += 1
                n_words += len(line.split())
    tmp.replace(output)
    return n_lines, n_words


def extract(name: str, assets: Path, output: Path) -> tuple[int, int]:
    """Extract one corpus from ``assets/NAME`` into ``output``; return (lines, words)."""
    root = assets / name
    if not root.is_dir():
        raise ExtractError(f"{root} does not exist (run: python -m workflow.fetch_assets {name})")
    return write_lines(EXTRACTORS[name](root), output)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", metavar="NAME", help=f"any of: {', '.join(EXTRACTORS)}")
    parser.add_argument("--assets", type=Path, default=Path("assets"), help="fetched assets")
    parser.add_argument("--output", type=Path, help="output file (only with a single NAME)")
    parser.add_argument(
        "--output-dir", type=Path, default=Path("corpus/raw"), help="folder for NAME.txt outputs"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in EXTRACTORS]
    if unknown:
        parser.error(f"unknown corpus {unknown}; choose from {list(EXTRACTORS)}")
    if args.output and len(args.names) > 1:
        parser.error("--output takes a single NAME; use --output-dir for several")
    counts = {}
    try:
        for name in dict.fromkeys(args.names):
            out = args.output or args.output_dir / OUTPUT_NAMES.get(name, f"{name}.txt")
            counts[name] = extract(name, args.assets, out)
            print(f"{name}: wrote {out}", flush=True)
    except (ExtractError, RDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{'corpus':<12} {'lines':>10} {'words':>12}")
    for name, (n_lines, n_words) in counts.items():
        print(f"{name:<12} {n_lines:>10,} {n_words:>12,}")
    if len(counts) > 1:
        total_lines = sum(c[0] for c in counts.values())
        total_words = sum(c[1] for c in counts.values())
        print(f"{'total':<12} {total_lines:>10,} {total_words:>12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
