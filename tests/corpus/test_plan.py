"""Corpus runs without Ray: inputs checked before anything is written, the manifest, the lock,
the storage options of embed_file and the joining of parts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import h5py
import numpy
import pytest

from spacy_elmo import BiLM
from spacy_elmo.corpus import embed_corpus
from spacy_elmo.corpus.apply import apply_corpus
from spacy_elmo.corpus.embed import join_hdf5
from spacy_elmo.corpus.embed_file import LineRange, embed_file, read_lines
from spacy_elmo.corpus.engine import require_ray
from spacy_elmo.corpus.plan import InputFile, find_inputs, plan_inputs
from spacy_elmo.corpus.runner import (
    LOCK_NAME,
    MANIFEST_NAME,
    ManifestWarning,
    append_record,
    is_done,
    make_record,
    output_lock,
    read_manifest,
)

SENTENCES = [
    "the cat sat on the mat .",
    "",
    "a dog ran",
    "the cat sat on the mat .",
    "ELMo vectors for spaCy",
    "one",
    "two words",
]


@pytest.fixture(scope="module")
def tiny(allennlp_fixture):
    return BiLM.load(
        None,
        options=allennlp_fixture / "options.json",
        weights=allennlp_fixture / "lm_weights.hdf5",
    )


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------- inputs
def test_inputs_of_a_folder_a_glob_and_a_file(tmp_path):
    write(tmp_path / "in" / "a.txt", ["x"])
    write(tmp_path / "in" / "deep" / "er" / "b.txt", ["y"])
    write(tmp_path / "in" / "c.md", ["z"])
    root, files = find_inputs(tmp_path / "in", (".txt",))
    assert root == (tmp_path / "in").resolve()
    assert [f.relative_to(root).as_posix() for f in files] == ["a.txt", "deep/er/b.txt"]
    root, files = find_inputs(f"{tmp_path}/in/**/b*.txt", (".txt",))
    assert [f.relative_to(root).as_posix() for f in files] == ["deep/er/b.txt"]
    root, files = find_inputs(tmp_path / "in" / "c.md", (".txt",))
    assert files == [(tmp_path / "in" / "c.md").resolve()]


def test_shards_read_back_the_lines_of_the_file(tmp_path):
    lines = [f"line {i} é" for i in range(23)]
    path = tmp_path / "in" / "a.txt"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8"))  # BOM, no final newline
    (item,) = plan_inputs(tmp_path / "in", tmp_path / "out", (".txt",), ".hdf5", shard_lines=5)
    assert item.lines == 23 and len(item.shards) == 5
    assert [r.count for r in item.shards] == [5, 5, 5, 5, 3]
    read = [line for r in item.shards for line in read_lines(path, r)]
    assert read == lines == list(read_lines(path))
    (whole,) = plan_inputs(tmp_path / "in", tmp_path / "out", (".txt",), ".hdf5", shard_lines=23)
    assert whole.shards == (LineRange(0, 0, 23),)


@pytest.mark.parametrize(
    "case, message",
    [
        ("not_utf8", r"in[/\\]b\.txt, line 2: not UTF-8 text"),
        ("nul_byte", r"in[/\\]b\.txt, line 2: not UTF-8 text \(a NUL byte at character 5\)"),
        ("output_is_folder", r"output .*out[/\\]b\.hdf5 is a folder"),
        ("output_under_a_file", r"output .*c[/\\]d\.hdf5 cannot be written: .*out[/\\]c is a file"),
        ("empty_file", r"input file .*in[/\\]b\.txt is empty"),
        ("empty_input", r"input .*in names no files"),
        ("output_inside_input", r"output folder .*in[/\\]out is inside the input folder"),
        ("named_twice", r"input .*link\.txt is named twice: it is the same file as .*b\.txt"),
        ("unreadable", r"input file .*broken\.txt cannot be read"),
        ("same_output", r"inputs .*b\.jsonl and .*b\.txt would both write"),
        ("bad_json", r"b\.jsonl, line 1: not JSON"),
        ("no_text", r"b\.jsonl, line 1: no string under the text key 'text'"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, case, message, bilm_dir, inline):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["fine"])
    output.mkdir()
    (output / "a.hdf5").write_bytes(b"an earlier output")
    (output / MANIFEST_NAME).write_text('{"output": "a.hdf5"}\n')
    before = snapshot(output)
    apply = False
    if case == "not_utf8":
        (inputs / "b.txt").write_bytes(b"good\nbad \xff byte\n")
    elif case == "nul_byte":  # UTF-8, but not text: the workers' read_lines refuses it
        (inputs / "b.txt").write_bytes(b"good\nbad \x00 byte\n")
    elif case == "output_is_folder":
        write(inputs / "b.txt", ["x"])
        (output / "b.hdf5").mkdir()
        before = snapshot(output)
    elif case == "output_under_a_file":
        write(inputs / "c" / "d.txt", ["x"])
        (output / "c").write_bytes(b"a file where a folder of outputs goes")
        before = snapshot(output)
    elif case == "empty_file":
        (inputs / "b.txt").write_bytes(b"")
    elif case == "empty_input":
        (inputs / "a.txt").unlink()
    elif case == "output_inside_input":
        output = inputs / "out"
        before = {}
    elif case == "named_twice":
        write(inputs / "b.txt", ["x"])
        (inputs / "link.txt").symlink_to(inputs / "b.txt")
    elif case == "unreadable":
        (inputs / "broken.txt").symlink_to(inputs / "missing")
    else:
        apply = True
        write(inputs / "b.txt", ["x"])
        text = {"same_output": '{"text": "y"}', "bad_json": "{nope", "no_text": '{"x": 1}'}[case]
        if case != "same_output":
            (inputs / "b.txt").unlink()
        write(inputs / "b.jsonl", [text])
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        if apply:
            apply_corpus(_blank_pipeline(tmp_path), inputs, output, progress=False)
        else:
            embed_corpus(inputs, output, model=str(bilm_dir), progress=False)
    assert snapshot(output) == before if output.exists() else not before


def _blank_pipeline(tmp_path: Path) -> Path:
    import spacy

    path = tmp_path / "pipeline"
    spacy.blank("en").to_disk(path)
    return path


def test_without_ray_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError) as error:
        require_ray()
    assert str(error.value) == (
        "corpus commands run on Ray, which is not installed: pip install 'ray>=2.60,<3' (in a "
        "clone of spacy-elmo's source: pip install -e '.[ray]')"
    )


# ----------------------------------------------------------------------------- lock
def test_a_second_run_into_the_same_folder_is_refused(tmp_path, bilm_dir):
    write(tmp_path / "in" / "a.txt", ["x"])
    with output_lock(tmp_path / "out", "embed-corpus"):
        with pytest.raises(ValueError, match=rf"in use by another run .*pid {os.getpid()}"):
            embed_corpus(tmp_path / "in", tmp_path / "out", model=str(bilm_dir), progress=False)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_the_lock_of_a_dead_run_is_taken_over(tmp_path):
    import subprocess

    folder = tmp_path / "out"
    code = (
        "import os\nfrom pathlib import Path\nfrom spacy_elmo.corpus.runner import output_lock\n"
        f"with output_lock(Path({str(folder)!r}), 'embed-corpus'): os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)  # dies holding the lock
    assert "embed-corpus" in (folder / LOCK_NAME).read_text()
    with output_lock(folder, "apply"):
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()


# ----------------------------------------------------------------------------- manifest
def test_manifest_records_what_is_done(tmp_path):
    (tmp_path / "a.hdf5").write_bytes(b"12345")
    model = {"kind": "saved", "name": "m", "sha256": "m1"}
    options = {"float16": False}
    source = tmp_path / "in" / "a.txt"  # named in the record, never read: absent
    assert not source.exists()
    item = InputFile(source, Path("a.hdf5"), "s1", 3, (LineRange(0, 0, 3),))
    record = make_record(item, tmp_path / "a.hdf5", 3, model, options, "o")
    append_record(tmp_path, record)
    with open(tmp_path / MANIFEST_NAME, "a") as handle:
        handle.write('{"output": "b.hdf5", "inpu')  # a run killed while writing its record
    with pytest.warns(ManifestWarning, match=r"manifest .*, line 2: ignored, a last line cut"):
        records = read_manifest(tmp_path)
    assert list(records) == ["a.hdf5"]
    assert is_done(records["a.hdf5"], tmp_path, "s1", model, options)
    assert not is_done(records["a.hdf5"], tmp_path, "s2", model, options)  # changed input
    assert not is_done(records["a.hdf5"], tmp_path, "s1", {**model, "sha256": "m2"}, options)
    assert not is_done(records["a.hdf5"], tmp_path, "s1", model, {"float16": True})
    (tmp_path / "a.hdf5").write_bytes(b"123456")  # the output was replaced
    assert not is_done(records["a.hdf5"], tmp_path, "s1", model, options)


# ----------------------------------------------------------------------------- storage
def test_float16_and_compression_against_float32(tmp_path, tiny):
    text = write(tmp_path / "a.txt", SENTENCES)
    embed_file(tiny, text, tmp_path / "f32.hdf5", progress=False)
    embed_file(tiny, text, tmp_path / "gzip.hdf5", progress=False, compression="gzip")
    embed_file(tiny, text, tmp_path / "lzf.hdf5", progress=False, compression="lzf")
    embed_file(tiny, text, tmp_path / "f16.hdf5", progress=False, float16=True)
    with (
        h5py.File(tmp_path / "f32.hdf5") as f32,
        h5py.File(tmp_path / "gzip.hdf5") as gz,
        h5py.File(tmp_path / "lzf.hdf5") as lzf,
        h5py.File(tmp_path / "f16.hdf5") as f16,
    ):
        assert set(f32) == set(gz) == set(lzf) == set(f16)
        assert f32["sentence_to_index"][0] == f16["sentence_to_index"][0]
        for key in f32:
            if key == "sentence_to_index":
                continue
            exact = f32[key][()]
            # an empty line's (L + 1, 0, D) array has no chunks, so no compression
            assert gz[key].compression == ("gzip" if exact.size else None)
            assert lzf[key].compression == ("lzf" if exact.size else None)
            numpy.testing.assert_array_equal(gz[key][()], exact)
            numpy.testing.assert_array_equal(lzf[key][()], exact)
            half = f16[key][()]
            assert half.dtype == numpy.float16
            # round to nearest: within half the spacing, 2**-11 of the value (normal numbers)
            bound = numpy.maximum(numpy.abs(exact) * 2.0**-11, 2.0**-25)
            assert numpy.all(numpy.abs(half.astype(numpy.float32) - exact) <= bound)
    with pytest.raises(ValueError, match="compression must be one of"):
        embed_file(tiny, text, tmp_path / "x.hdf5", progress=False, compression="zstd")


def test_parts_joined_equal_the_whole_file(tmp_path, tiny):
    text = write(tmp_path / "a.txt", SENTENCES)
    embed_file(tiny, text, tmp_path / "whole.hdf5", progress=False, float16=True)
    offsets, position = [], 0
    for line in SENTENCES:
        offsets.append(position)
        position += len(line.encode("utf-8")) + 1
    ranges = [LineRange(0, 0, 3), LineRange(3, offsets[3], 3), LineRange(6, offsets[6], 1)]
    parts = []
    for r in ranges:
        part = tmp_path / f"part{r.first}.hdf5"
        n = embed_file(tiny, text, part, progress=False, float16=True, lines=r)
        assert n == r.count
        parts.append(part)
    assert join_hdf5(parts, tmp_path / "joined.hdf5") == len(SENTENCES)
    with h5py.File(tmp_path / "whole.hdf5") as whole, h5py.File(tmp_path / "joined.hdf5") as joined:
        assert set(whole) == set(joined)
        assert whole["sentence_to_index"][0] == joined["sentence_to_index"][0]
        assert json.loads(joined["sentence_to_index"][0])["the cat sat on the mat ."] == "0"
        for key in whole:
            if key != "sentence_to_index":
                assert joined[key].dtype == numpy.float16
                numpy.testing.assert_allclose(joined[key][()], whole[key][()], atol=1e-3)
