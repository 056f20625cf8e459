"""Offline tests of the corpus scripts on tiny inputs synthesised in the test."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from pathlib import Path

import pytest

from workflow import extract_text as ex
from workflow import fetch_assets as fa
from workflow import rdata
from workflow import split_corpus as sc

# ---------------------------------------------------------------------------------------------
# Small text helpers


def test_strip_brown_tags():
    line = "\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' 1/2/cd ./."
    assert ex.strip_brown_tags(line) == 'The jury said " no evidence " 1/2 .'


def test_extract_brown_files(tmp_path):
    pkg = tmp_path / "package"
    pkg.mkdir()
    (pkg / "ca01").write_text("\n\n\tThe/at cat/nn ./.\n\n\n\tA/at dog/nn ./.\n")
    (pkg / "README").write_text("not/a corpus/file\n")
    assert list(ex.extract_brown(tmp_path)) == ["The cat .", "A dog ."]


def test_split_sentences_keeps_abbreviations():
    text = "Mr. Smith went to the U.S. Congress. He spoke! Then J. Doe left. 1812 came."
    assert ex.split_sentences(text) == [
        "Mr. Smith went to the U.S. Congress.",
        "He spoke!",
        "Then J. Doe left.",
        "1812 came.",
    ]


def test_paragraphs_join_lines():
    assert list(ex.paragraphs(["a b", "c", "", "", "d", ""])) == ["a b c", "d"]


def test_conll_sentences_skip_docstart():
    lines = [
        "-DOCSTART- -X- -X- O",
        "",
        "EU NNP B-NP B-ORG",
        "rejects VBZ B-VP O",
        "",
        "Peter NNP B-NP B-PER",
        "",
    ]
    assert list(ex.conll_sentences(lines)) == ["EU rejects", "Peter"]


def test_conll_extractor_reads_train_only(tmp_path):
    (tmp_path / "train.txt").write_text("A DT O O\nb NN O O\n")
    (tmp_path / "test.txt").write_text("SECRET NN O O\n")
    (tmp_path / "valid.txt").write_text("SECRET NN O O\n")
    assert list(ex.extract_conll2003(tmp_path)) == ["A b"]


def test_nlp_corpus_and_moby_dick(tmp_path):
    builds = tmp_path / "package" / "builds"
    builds.mkdir(parents=True)
    (builds / "doc-10.json").write_text(json.dumps(["third"]))
    (builds / "doc-2.json").write_text(json.dumps(["first", "second"]))
    assert list(ex.extract_nlp_corpus(tmp_path)) == ["first", "second", "third"]

    data = tmp_path / "moby" / "data"
    data.mkdir(parents=True)
    (data / "file_list.json").write_text(json.dumps(["contents.txt", "chapter_1.txt"]))
    (data / "contents.txt").write_text("CONTENTS\n")
    (data / "chapter_1.txt").write_text("CHAPTER 1. Loomings.\n\nCall me\nIshmael.\n\nSome.\n")
    assert list(ex.extract_moby_dick(tmp_path / "moby")) == ["Call me Ishmael.", "Some."]


# ---------------------------------------------------------------------------------------------
# reStructuredText prose

RST = """\
.. SPDX-License-Identifier: GPL-2.0

==========
Some Title
==========

:Author: Someone <a@b.c>

The world of PCI is vast and full of surprises, see :ref:`the guide <pci-guide>`
and ``pci_register_driver()`` for **details**.

Structure of drivers
====================
Drivers discover devices in a system via the registration call.

.. code-block:: c

   int main(void) { return 0; }

Use it like this::

    $ echo 1 > /sys/bus/pci/rescan

  - an indented list item that is not prose
- a list item at the margin

+-------+-------+
| a     | b     |
+-------+-------+

===== =====
col   col2
===== =====

struct foo { int a; int b; }; x->y = 3;
"""


def test_rst_prose_keeps_only_paragraphs():
    assert list(ex.rst_prose(RST)) == [
        "The world of PCI is vast and full of surprises, see the guide and "
        "pci_register_driver() for details.",
        "Drivers discover devices in a system via the registration call.",
        "Use it like this:",
    ]


def test_linux_doc_skips_translations(tmp_path):
    src = tmp_path / "html" / "_sources"
    (src / "translations" / "it_IT").mkdir(parents=True)
    (src / "index.rst.txt").write_text("This is a small English paragraph here.\n")
    (src / "translations" / "it_IT" / "index.rst.txt").write_text("Questo è un paragrafo qui.\n")
    assert list(ex.extract_linux_doc(tmp_path)) == ["This is a small English paragraph here."]


# ---------------------------------------------------------------------------------------------
# SWORD zText


def _write_ztext(folder: Path, testament: str, blocks: list[list[str]]) -> None:
    """Write a zText testament: zlib blocks (.bzz), block index (.bzs), verse index (.bzv)."""
    bzz, bzs, bzv = bytearray(), bytearray(), bytearray()
    bzv += struct.pack("<IIH", 0, 0, 0)  # empty entry (module/testament heading)
    for number, entries in enumerate(blocks):
        raw = "".join(entries).encode("utf-8")
        packed = zlib.compress(raw)
        bzs += struct.pack("<III", len(bzz), len(packed), len(raw))
        bzz += packed
        offset = 0
        for entry in entries:
            size = len(entry.encode("utf-8"))
            bzv += struct.pack("<IIH", number, offset, size)
            offset += size
    for ext, data in (("bzz", bzz), ("bzs", bzs), ("bzv", bzv)):
        (folder / f"{testament}.{ext}").write_bytes(bytes(data))


def test_ztext_reader_and_osis_stripping(tmp_path):
    module = tmp_path / "modules" / "texts" / "ztext" / "web"
    module.mkdir(parents=True)
    ot = [
        [
            '<title type="main">Genesis</title><chapter n="1" sID="Gen.1"/>',
            '<w lemma="strong:H1">In</w> the beginning, God<note placement="foot">A '
            'note.</note> created the <div sID="g1" type="x-p"/>heavens &amp; earth.',
        ],
        ["Now the earth <d", 'iv type="x-p" sID="g2"/>was “formless”.'],
    ]
    _write_ztext(module, "ot", ot)
    _write_ztext(module, "nt", [["In the beginning was the Word."]])
    assert list(ex.read_ztext(module, "nt")) == ["In the beginning was the Word."]
    assert list(ex.extract_web_bible(tmp_path)) == [
        "In the beginning, God created the",
        "heavens & earth.",
        "Now the earth",
        "was “formless”.",
        "In the beginning was the Word.",
    ]


def test_ztext_bad_index_size(tmp_path):
    _write_ztext(tmp_path, "ot", [["x"]])
    (tmp_path / "ot.bzv").write_bytes(b"123")
    with pytest.raises(ex.ExtractError, match="ot.bzv"):
        list(ex.read_ztext(tmp_path, "ot"))


# ---------------------------------------------------------------------------------------------
# R serialization and lazy-load database (hand-written XDR serializer)


def _flags(sexptype: int, has_attr: bool = False, has_tag: bool = False, levels: int = 0) -> bytes:
    return struct.pack(">i", sexptype | (has_attr << 9) | (has_tag << 10) | (levels << 12))


def _charsxp(text: str | None) -> bytes:
    if text is None:
        return _flags(9) + struct.pack(">i", -1)
    raw = text.encode("utf-8")
    return _flags(9, levels=8) + struct.pack(">i", len(raw)) + raw  # UTF8_MASK


def _strsxp(items: list[str | None], attrs: bytes = b"") -> bytes:
    body = struct.pack(">i", len(items)) + b"".join(_charsxp(s) for s in items)
    return _flags(16, has_attr=bool(attrs)) + body + attrs


def _names_attr(names: list[str]) -> bytes:
    """A pairlist ``names = c(...)`` as written for attributes; the symbol is new."""
    return _flags(2, has_tag=True) + _flags(1) + _charsxp("names") + _strsxp(names) + _flags(254)


def _intsxp(values: list[int]) -> bytes:
    return _flags(13) + struct.pack(f">i{len(values)}i", len(values), *values)


def _vecsxp(items: list[bytes], names: list[str] | None = None) -> bytes:
    attrs = _names_attr(names) if names else b""
    return (
        _flags(19, has_attr=bool(attrs)) + struct.pack(">i", len(items)) + b"".join(items) + attrs
    )


def _serialize(body: bytes, version: int = 3) -> bytes:
    head = b"X\n" + struct.pack(">iii", version, 0x40201, 0x30500)
    if version == 3:
        head += struct.pack(">i", 5) + b"UTF-8"
    return head + body


def test_unserialize_strings_and_lists():
    obj = rdata.unserialize(_serialize(_strsxp(["a", None, "é"])))
    assert obj.sexptype == rdata.STRSXP and obj.value == ["a", None, "é"]
    lst = rdata.unserialize(_serialize(_vecsxp([_intsxp([1, 2]), _strsxp(["x"])], ["n", "s"]), 2))
    assert lst.value[0].value == [1, 2]
    assert lst.attributes["names"].value == ["n", "s"]


def test_unserialize_rejects_ascii_format():
    with pytest.raises(rdata.RDataError, match="XDR"):
        rdata.unserialize(b"A\n3\n")


def _lazyload_db(folder: Path, variables: dict[str, list[str]]) -> None:
    """Write Rdata.rdb (4-byte length + zlib per value) and a gzip'd Rdata.rdx index."""
    rdb, positions = bytearray(), []
    for lines in variables.values():
        data = _serialize(_strsxp(lines))
        blob = struct.pack(">I", len(data)) + zlib.compress(data)
        positions.append(_intsxp([len(rdb), len(blob)]))
        rdb += blob
    index = _vecsxp(
        [_vecsxp(positions, list(variables)), _vecsxp([]), _flags(10) + struct.pack(">ii", 1, 1)],
        ["variables", "references", "compressed"],
    )
    (folder / "Rdata.rdb").write_bytes(bytes(rdb))
    (folder / "Rdata.rdx").write_bytes(gzip.compress(_serialize(index)))


def test_austen_from_lazyload_db(tmp_path):
    data = tmp_path / "janeaustenr" / "data"
    data.mkdir(parents=True)
    books = {
        name: ["CHAPTER 1", "", f"{name} first", "line.", "", "Next."] for name in ex.AUSTEN_BOOKS
    }
    books["emma"] = ["EMMA", "", "by Jane Austen", "", "Emma Woodhouse, handsome,", "clever."]
    _lazyload_db(data, dict(reversed(list(books.items()))))
    index = rdata.read_lazyload_index(data / "Rdata.rdx")
    assert set(index) == set(ex.AUSTEN_BOOKS)
    assert rdata.read_lazyload_value(data / "Rdata.rdb", *index["emma"]).value == books["emma"]
    out = list(ex.extract_austen(tmp_path))
    assert out[:2] == ["sensesensibility first line.", "Next."]
    assert "Emma Woodhouse, handsome, clever." in out
    assert "EMMA" not in out and "by Jane Austen" not in out and len(out) == 11


# ---------------------------------------------------------------------------------------------
# Whole-file writing, splitting and fetching


def test_extract_cli_writes_counts(tmp_path, capsys):
    assets = tmp_path / "assets"
    (assets / "conll2003").mkdir(parents=True)
    (assets / "conll2003" / "train.txt").write_text("-DOCSTART- -X- -X- O\n\nA x\nb y\n\nC z\n")
    assert ex.main(["conll2003", "--assets", str(assets), "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "conll2003_train.txt").read_text() == "A b\nC\n"
    assert "conll2003" in capsys.readouterr().out


def test_split_is_deterministic_and_complete(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    lines = [f"sentence number {i}" for i in range(2000)]
    a.write_text("\n".join(lines[:1000]) + "\n\n")
    b.write_text("\n".join(lines[1000:]) + "\n")
    outs = []
    for run in range(2):
        train, dev = tmp_path / f"train{run}.txt", tmp_path / f"dev{run}.txt"
        counts = sc.split_files([a, b], train, dev, 0.1, seed=0)
        outs.append((train.read_text(), dev.read_text()))
        assert counts["train_lines"] + counts["dev_lines"] == 2000
    assert outs[0] == outs[1]
    dev_lines = outs[0][1].splitlines()
    assert 120 < len(dev_lines) < 280
    assert set(dev_lines) | set(outs[0][0].splitlines()) == set(lines)
    assert not set(dev_lines) & set(outs[0][0].splitlines())
    # Membership depends only on the line and the seed, not on order or file.
    assert all(sc.is_dev(line, 0.1, 0) for line in dev_lines)
    other = {line for line in lines if sc.is_dev(line, 0.1, 1)}
    assert other != set(dev_lines)


def test_every_text_source_has_an_extractor():
    # Static vectors, the probes' annotated data and the transformer pipeline's weights are
    # fetched too, but are not pretraining text.
    not_text = {"en_core_web_md", "wsj_sample", "wordnet", "minilm"}
    assert set(fa.SOURCES) - not_text == set(ex.EXTRACTORS)


def test_reuters21578_paragraphs_without_signature_or_symbols(tmp_path):
    data = tmp_path / "reuters" / "package" / "data" / "full"
    data.mkdir(parents=True)
    first = {
        "title": "STANDARD OIL <SRD> TO FORM FINANCIAL UNIT",
        "body": "Standard Oil Co <SRD> and <BP North America\nInc> said they plan\nto form "
        "a venture.\n    BP North America is a subsidiary.\n       \n Reuter\n\x03",
    }
    second = {"title": "NO BODY", "id": "2"}  # some stories have no body
    third = {"body": "Prices rose.\n\n Reuter\n\x03"}
    (data / "reuters-001.json").write_text(json.dumps([third]))
    (data / "reuters-000.json").write_text(json.dumps([first, second]))
    (data.parent / "noIDs").mkdir()  # other copies of the stories are not read
    (data.parent / "noIDs" / "reuters-000.json").write_text(json.dumps([first]))
    assert list(ex.extract_reuters21578(tmp_path / "reuters")) == [
        "Standard Oil Co and BP North America Inc said they plan to form a venture.",
        "BP North America is a subsidiary.",
        "Prices rose.",
    ]
    (data / "reuters-002.json").write_text(json.dumps({"body": "not a list"}))
    with pytest.raises(ex.ExtractError, match="expected a JSON array"):
        list(ex.extract_reuters21578(tmp_path / "reuters"))


def test_tokenize_text_matches_the_pretraining_splitter(tmp_path):
    import spacy

    from workflow import tokenize_text as tokenize

    raw = tmp_path / "raw.txt"
    raw.write_text("Dr. Smith's bank rose 5.93 pct. It said so!\n\nPrices fell.\n")
    out = tmp_path / "tokens.txt"
    assert tokenize.main([str(raw), str(out), "--max-tokens", "4"]) == 0
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    expected = []
    for line in raw.read_text().splitlines():
        for sent in nlp(line).sents if line.strip() else []:
            words = [t.text for t in sent if not t.is_space]
            expected += [" ".join(words[i : i + 4]) for i in range(0, len(words), 4)]
    assert out.read_text().splitlines() == expected
    assert tokenize.main([str(tmp_path / "missing.txt"), str(out)]) == 1
    assert tokenize.main([str(raw), str(raw)]) == 1
