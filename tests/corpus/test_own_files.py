"""A corpus run touches only what it writes, never loops over an input tree, is never
stuck for good by a file name or its own manifest, and checks every input before it writes.

The runs here are whole runs of the driver (runner.py) with their shards run in this process
(the `inline` fixture of conftest.py), so they need no Ray; ray_cases.py runs the real engine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import h5py
import pytest
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.corpus import apply_corpus, embed_corpus
from spacy_elmo.corpus.embed_file import LineRange
from spacy_elmo.corpus.plan import InputFile, find_inputs, plan_inputs
from spacy_elmo.corpus.runner import (
    LOCK_NAME,
    MANIFEST_NAME,
    ManifestWarning,
    append_record,
    make_record,
    owned_name,
    read_manifest,
)

from ..pipeline.pipeline_util import save_tiny_bilm

NOT_UTF8 = os.fsdecode(b"b\xff.txt")  # a file name with a byte that is not UTF-8


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("own") / "bilm"
    save_tiny_bilm(folder)
    return folder


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (names as bytes, so that any name shows) and its bytes."""
    found = {}
    for top, _, names in os.walk(os.fsencode(folder)):
        for name in names:
            path = os.path.join(top, name)
            found[os.path.relpath(path, os.fsencode(folder)).decode("utf-8", "replace")] = Path(
                os.fsdecode(path)
            ).read_bytes()
    return found


def embed(inputs, output, model, **options):
    return embed_corpus(inputs, output, model=str(model), progress=False, **options)


# ----------------------------------------------------------------------------- 1. own files
USER_FILES = {
    ".notes.tmp": b"a user's own temporary file",
    "sub/.draft.txt.tmp": b"another",
    ".a.hdf5.k3j4h5g6.tmp": b"another program's atomic write of a.hdf5",
    "keep.tmp": b"not hidden",
    ".other.hdf5.spacy-elmo-tmp-0123abcd": b"a name this run does not write",
}
STALE = [  # what an interrupted run leaves for the files this run writes
    ".a.hdf5.spacy-elmo-tmp-0123abcd",
    "..a.hdf5.spacy-elmo-tmp-0123abcd.k3j4h5g6.tmp",
    "sub/..c.hdf5.spacy-elmo-tmp-89abcdef.zz_9zz9z.tmp",
    "..manifest.jsonl.spacy-elmo-tmp-00ff00ff.abcdefgh.tmp",
]


def test_a_run_removes_only_the_temporary_files_it_made(tmp_path, model, inline):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["a b", "c d", "e f"])
    write(inputs / "sub" / "c.txt", ["x y"])
    for name, data in USER_FILES.items():
        (output / name).parent.mkdir(parents=True, exist_ok=True)
        (output / name).write_bytes(data)
    for name in STALE:
        (output / name).write_bytes(b"half")
    result = embed(inputs, output, model, shard_lines=2)
    assert sorted(result.written) == ["a.hdf5", "sub/c.hdf5"]
    files = tree(output)
    assert {name: files.get(name) for name in USER_FILES} == USER_FILES
    assert not [name for name in STALE if name in files]
    assert sorted(set(files) - set(USER_FILES)) == [
        LOCK_NAME,
        "a.hdf5",
        MANIFEST_NAME,
        "sub/c.hdf5",
    ]
    # and when there is nothing to do
    for name in STALE:
        (output / name).write_bytes(b"half")
    result = embed(inputs, output, model, shard_lines=2)
    assert result.stats is None and sorted(result.skipped) == ["a.hdf5", "sub/c.hdf5"]
    files = tree(output)
    assert {name: files.get(name) for name in USER_FILES} == USER_FILES
    assert not [name for name in STALE if name in files]


def test_the_run_knows_its_temporary_names_and_no_others():
    assert owned_name(".a.hdf5.spacy-elmo-tmp-0123abcd") == "a.hdf5"
    assert owned_name("..a.hdf5.spacy-elmo-tmp-0123abcd.k3j4h5g6.tmp") == "a.hdf5"
    assert owned_name("...x.spacy.spacy-elmo-tmp-0123abcd.k3j4h5g6.tmp") == ".x.spacy"
    assert owned_name("..x.spacy.spacy-elmo-tmp-0123abcd") == ".x.spacy"  # a hidden output's
    for name in [
        ".a.hdf5.k3j4h5g6.tmp",
        ".a.hdf5.spacy-elmo-tmp-0123ABCD",
        "a.hdf5.spacy-elmo-tmp-0123abcd",
        ".a.hdf5.spacy-elmo-tmp-0123abcd.tmp",
        ".a.hdf5.spacy-elmo-tmp-0123abc",
    ]:
        assert owned_name(name) is None, name


def test_stale_parts_go_but_not_a_users_file_among_them(tmp_path, model, inline):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["a b", "c d", "e f"])
    stale = output / f".a.hdf5.parts-{'0' * 16}"
    stale.mkdir(parents=True)
    (stale / "000000000000-2.hdf5").write_bytes(b"a part of an earlier model")
    (stale / ".000000000000-2.hdf5.spacy-elmo-tmp-0123abcd").write_bytes(b"half")
    (stale / "mine.txt").write_bytes(b"a user's file")
    lookalike = output / ".a.hdf5.parts-mine"
    lookalike.mkdir()
    (lookalike / "000000000000-2.hdf5").write_bytes(b"not a folder of parts")
    embed(inputs, output, model, shard_lines=2)
    assert sorted(p.name for p in stale.iterdir()) == ["mine.txt"]
    assert (lookalike / "000000000000-2.hdf5").read_bytes() == b"not a folder of parts"
    parts = sorted(p.name for p in output.glob(".a.hdf5.parts-*"))
    assert parts == sorted([lookalike.name, stale.name])  # the run's own parts: joined and gone


def _pair(tmp_path: Path, allennlp_fixture: Path) -> Path:
    folder = tmp_path / "pair"
    folder.mkdir()
    for name in ("options.json", "lm_weights.hdf5"):
        shutil.copy(allennlp_fixture / name, folder / name)
    return folder


@pytest.mark.parametrize(
    "case, message",
    [
        ("is", r"output folder .*bilm is the model's folder .*bilm"),
        ("inside", r"output folder .*bilm[/\\]out is inside the model's folder"),
        ("contains", r"output folder .*models contains the model's folder .*bilm"),
        ("link", r"output folder .*link is the model's folder"),
        ("dotdot", r"output folder .*deep[/\\]\.\. is the model's folder"),
        ("holds_pair", r"output folder .*pair contains the model's file .*options\.json"),
        ("run", r"output folder .*run contains the model's folder .*run[/\\]model"),
        ("tokenizer", r"output folder .*pipeline is the pipeline's folder"),
    ],
)
def test_an_output_folder_over_the_models_files_is_refused(
    tmp_path, case, message, inline, allennlp_fixture
):
    inputs = tmp_path / "in"
    write(inputs / "lm_weights.txt", ["named like the weights"])
    write(inputs / "model.txt", ["named like a saved model's weights"])
    bilm = tmp_path / "models" / "bilm"
    save_tiny_bilm(bilm)
    options: dict = {"model": str(bilm)}
    output = bilm
    if case == "inside":
        output = bilm / "out"
    elif case == "contains":
        output = bilm.parent
    elif case == "link":
        output = tmp_path / "link"
        output.symlink_to(bilm)
    elif case == "dotdot":  # by name the folder above the models; on disk the model's
        (tmp_path / "deep").symlink_to(bilm / "sub")
        (bilm / "sub").mkdir()
        output = tmp_path / "deep" / ".."
    elif case == "holds_pair":
        output = _pair(tmp_path, allennlp_fixture)
        options = {
            "model": None,
            "options_file": output / "options.json",
            "weights_file": output / "lm_weights.hdf5",
        }
    elif case == "run":
        output = tmp_path / "run"
        save_tiny_bilm(output / "model")
        options = {"model": str(output)}
    elif case == "tokenizer":
        import spacy

        output = tmp_path / "pipeline"
        spacy.blank("en").to_disk(output)
        options["pipeline"] = str(output)
        options["pretokenized"] = False
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=message):
        embed_corpus(inputs, output, progress=False, **options)
    assert tree(tmp_path) == before  # nothing written: no lock, no output, no manifest


def test_a_file_in_an_outputs_place_that_the_manifest_does_not_record_is_never_replaced(
    tmp_path, allennlp_fixture
):
    """The model's folder reached by a second path that no link or `..` explains (a bind
    mount): an input named like its weights file would overwrite them, but a run replaces only
    the outputs its manifest records, and refuses before it writes anything."""
    from ..util.bind_mount import bind_mounted

    inputs = tmp_path / "in"
    write(inputs / "lm_weights.txt", ["named like the weights"])
    pair = _pair(tmp_path, allennlp_fixture)
    mount = tmp_path / "mounted"
    prefix = bind_mounted(pair, mount)
    before = tree(pair)
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "spacy_elmo.cli", "embed-corpus", str(inputs),
         str(mount), "--options", str(pair / "options.json"), "--weights",
         str(pair / "lm_weights.hdf5"), "--workers", "1", "--quiet"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == (
        f"error: output {mount / 'lm_weights.hdf5'} exists and manifest.jsonl does not record "
        "it: a run replaces only the outputs it wrote; move it away or choose another output "
        "folder\n"
    )
    assert tree(pair) == before


def test_a_users_file_in_an_outputs_place_is_refused(tmp_path, model, inline):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["a b"])
    (output / "a.hdf5").parent.mkdir(parents=True)
    (output / "a.hdf5").write_bytes(b"a user's own file")
    with pytest.raises(ValueError, match=r"output .*a\.hdf5 exists and manifest\.jsonl does not"):
        embed(inputs, output, model)
    assert tree(output) == {"a.hdf5": b"a user's own file"}


@pytest.mark.parametrize("case", ["is", "inside", "contains"])
def test_an_output_folder_over_the_pipeline_is_refused(tmp_path, case, inline):
    import spacy

    pipeline = tmp_path / "pipelines" / "ner"
    pipeline.parent.mkdir()
    spacy.blank("en").to_disk(pipeline)
    write(tmp_path / "in" / "config.txt", ["named like the pipeline's config"])
    output = {"is": pipeline, "inside": pipeline / "out", "contains": pipeline.parent}[case]
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=rf"output folder .* {case} the pipeline's folder"):
        apply_corpus(pipeline, tmp_path / "in", output, progress=False)
    assert tree(tmp_path) == before


def test_a_model_next_to_the_output_folder_is_fine(tmp_path, model, inline):
    write(tmp_path / "in" / "a.txt", ["a b"])
    shutil.copytree(model, tmp_path / "bilm")
    result = embed(tmp_path / "in", tmp_path / "vectors", tmp_path / "bilm")
    assert result.written == ["a.hdf5"]
    again = embed(tmp_path / "in", tmp_path / "vectors", tmp_path / "bilm")
    assert again.stats is None and again.skipped == ["a.hdf5"]


# ----------------------------------------------------------------------------- 3. links
@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging: the walk of a tree that loops never ends."""

    def expire(signum, frame):
        raise TimeoutError(f"still walking after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _looping_tree(tmp_path: Path) -> Path:
    inputs = tmp_path / "in"
    write(inputs / "a.txt", ["a"])
    write(inputs / "sub" / "b.txt", ["b"])
    write(inputs / "sub" / "deeper" / "c.txt", ["c"])
    write(tmp_path / "elsewhere" / "d.txt", ["d"])
    (inputs / "self").symlink_to(".")
    (inputs / "sub" / "up").symlink_to("..")
    (inputs / "sub" / "again").symlink_to("../sub")
    (inputs / "sub" / "deeper" / "top").symlink_to("../..")
    (inputs / "sub" / "deeper" / "loop").symlink_to("../deeper")
    (inputs / "l1").symlink_to("../elsewhere")
    (inputs / "sub" / "l2").symlink_to("../../elsewhere")
    return inputs


def test_a_tree_with_links_to_its_own_folders_is_walked_once_per_real_folder(tmp_path):
    inputs = _looping_tree(tmp_path)
    expected = ["a.txt", "l1/d.txt", "sub/b.txt", "sub/deeper/c.txt"]
    with deadline(30):
        root, files = find_inputs(inputs, (".txt",))
        assert [f.relative_to(root).as_posix() for f in files] == expected
        root, files = find_inputs(f"{inputs}/**/*.txt", (".txt",))
        assert [f.relative_to(root).as_posix() for f in files] == expected
        root, files = find_inputs(f"{inputs}/*/*.txt", (".txt",))
        assert [f.relative_to(root).as_posix() for f in files] == ["l1/d.txt", "sub/b.txt"]
        planned = plan_inputs(inputs, tmp_path / "out", (".txt",), ".hdf5", 10)
        assert [p.output_rel.as_posix() for p in planned] == [
            "a.hdf5",
            "l1/d.hdf5",
            "sub/b.hdf5",
            "sub/deeper/c.hdf5",
        ]


def test_globs_keep_their_rules_for_hidden_names(tmp_path):
    write(tmp_path / "in" / "a.txt", ["a"])
    write(tmp_path / "in" / ".hidden.txt", ["h"])
    write(tmp_path / "in" / ".cache" / "b.txt", ["b"])
    write(tmp_path / "in" / "x" / "y" / "c.txt", ["c"])
    root, files = find_inputs(f"{tmp_path}/in/**/*.txt", (".txt",))
    assert [f.relative_to(root).as_posix() for f in files] == ["a.txt", "x/y/c.txt"]
    root, files = find_inputs(f"{tmp_path}/in/.*/*.txt", (".txt",))
    assert [f.relative_to(root).as_posix() for f in files] == [".cache/b.txt"]
    root, files = find_inputs(f"{tmp_path}/in/x/*/c.t[xy]t", (".txt",))
    assert [f.relative_to(root).as_posix() for f in files] == ["y/c.txt"]


# ----------------------------------------------------------------------------- 4. not stuck
def test_a_file_name_that_is_not_utf8_is_kept_whole(tmp_path, model, inline):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["a b"])
    write(inputs / "sub" / NOT_UTF8, ["c d", "e f", "g h"])
    result = embed(inputs, output, model, shard_lines=2)
    assert sorted(result.written) == ["a.hdf5", "sub/b\udcff.hdf5"]
    with h5py.File(output / "sub" / os.fsdecode(b"b\xff.hdf5")) as vectors:
        assert sorted(vectors) == ["0", "1", "2", "sentence_to_index"]
    text = (output / MANIFEST_NAME).read_bytes().decode("utf-8")  # valid UTF-8
    assert "b\\udcff.hdf5" in text and "b\\udcff.txt" in text
    records = read_manifest(output)
    assert records["sub/b\udcff.hdf5"]["input"] == str(inputs / "sub" / NOT_UTF8)
    again = embed(inputs, output, model, shard_lines=2)
    assert again.stats is None and len(again.skipped) == 2


def test_a_bad_input_whose_name_is_not_utf8_is_named_by_its_bytes(tmp_path, model, inline):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / NOT_UTF8).write_bytes(b"")
    with pytest.raises(ValueError, match=r"input file .*in[/\\]b\\xff\.txt is empty"):
        embed(tmp_path / "in", tmp_path / "out", model)


def test_the_commands_report_a_name_that_is_not_utf8(tmp_path, model, inline):
    inputs = tmp_path / "in"
    write(inputs / NOT_UTF8, ["a b"])
    output = tmp_path / os.fsdecode(b"out\xfe")
    result = CliRunner().invoke(
        app, ["embed-corpus", str(inputs), str(output), "-m", str(model), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "wrote 1 outputs" in result.output and "out\\xfe" in result.output
    assert (output / os.fsdecode(b"b\xff.hdf5")).is_file()


def _record(folder: Path, name: str = "a.hdf5", **changes) -> dict:
    (folder / name).write_bytes(b"12345")
    model = {"kind": "saved", "name": "m", "sha256": "m1"}
    source = folder / "in" / "é.txt"  # named in the record, never read: absent
    assert not source.exists()
    item = InputFile(source, Path(name), "s1", 3, (LineRange(0, 0, 3),))
    record = make_record(item, folder / name, 3, model, {}, "o")
    return {**record, **changes}


def test_a_last_line_cut_inside_a_character_is_ignored_with_a_warning(tmp_path):
    append_record(tmp_path, _record(tmp_path))
    line = json.dumps(_record(tmp_path, "b.hdf5"), ensure_ascii=False).encode("utf-8")
    cut = line[: line.index("é".encode()) + 1]  # inside the two bytes of "é"
    with open(tmp_path / MANIFEST_NAME, "ab") as handle:
        handle.write(cut)
    with pytest.warns(ManifestWarning) as caught:
        records = read_manifest(tmp_path)
    assert list(records) == ["a.hdf5"]
    (warning,) = caught
    assert str(warning.message).startswith(
        f"manifest {tmp_path / MANIFEST_NAME}, line 2: ignored, a last line cut short (not UTF-8"
    )


def test_a_run_after_a_cut_manifest_goes_on(tmp_path, model, inline):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "é.txt", ["a b"])
    write(inputs / "z.txt", ["c d"])
    embed(inputs, output, model)
    whole = (output / MANIFEST_NAME).read_bytes()
    lines = whole.splitlines(keepends=True)
    cut = lines[1][: lines[1].index("é".encode()) + 1]
    (output / MANIFEST_NAME).write_bytes(lines[0] + cut)  # a record half written
    cut_output = json.loads(lines[1])["output"]
    (output / cut_output).unlink()  # an output is installed only once its record is whole
    with pytest.warns(ManifestWarning, match=r"manifest .*manifest\.jsonl, line 2: ignored"):
        result = embed(inputs, output, model)
    assert result.skipped == ["z.hdf5"] or result.skipped == ["é.hdf5"]
    assert len(result.written) == 1
    records = read_manifest(output)  # whole again, no warning
    assert sorted(records) == ["z.hdf5", "é.hdf5"]


@pytest.mark.parametrize(
    "line, problem",
    [
        ('"a.hdf5"', "a JSON str, not an object"),
        ("[1, 2]", "a JSON list, not an object"),
        ("MODEL", "its 'model' is a str, not a dict"),
        ("OPTIONS", "its 'options' is a list, not a dict"),
        ('{"output": ["a.hdf5"]}', "its 'output' is a list, not a str"),
        ('{"output": "a.hdf5"}', "its 'input_sha256' is missing, not a str"),
        ("{nope", "not JSON"),
        ("BYTES", "not UTF-8"),
    ],
)
def test_a_record_of_the_wrong_shape_stops_the_run_naming_the_line(
    tmp_path, model, line, problem, inline
):
    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["a b"])
    embed(inputs, output, model)
    good = (output / MANIFEST_NAME).read_bytes()
    record = json.loads(good)
    if line == "MODEL":
        line = json.dumps({**record, "model": "bundled"})
    elif line == "OPTIONS":
        line = json.dumps({**record, "options": ["float16"]})
    data = line.encode("utf-8") if line != "BYTES" else b'{"output": "\xc3"}'
    (output / MANIFEST_NAME).write_bytes(good + data + b"\n" + good)  # line 2 of 3
    (inputs / "a.txt").write_text("changed\n")
    before = tree(output)
    del before[LOCK_NAME]  # the lock is taken (its holder written) before the manifest is read
    result = CliRunner().invoke(
        app, ["embed-corpus", str(inputs), str(output), "-m", str(model), "-q"]
    )
    assert result.exit_code == 1, result.output
    (message,) = result.output.strip().splitlines()
    assert message.startswith(
        f"error: manifest {output / MANIFEST_NAME}, line 2: not a record of spacy-elmo ({problem}"
    )
    assert message.endswith(
        "remove that line (its output is then done again) or choose another output folder"
    )
    after = tree(output)
    del after[LOCK_NAME]
    assert after == before  # nothing else written


def test_a_failed_append_leaves_the_manifest_as_it_was(tmp_path, monkeypatch):
    from spacy_elmo.corpus import runner

    append_record(tmp_path, _record(tmp_path))
    before = (tmp_path / MANIFEST_NAME).read_bytes()

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runner.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        append_record(tmp_path, _record(tmp_path, "b.hdf5"))
    monkeypatch.undo()
    assert (tmp_path / MANIFEST_NAME).read_bytes() == before
    append_record(tmp_path, _record(tmp_path, "c.hdf5"))
    assert sorted(read_manifest(tmp_path)) == ["a.hdf5", "c.hdf5"]


# ----------------------------------------------------------------------------- 6. checked first
@pytest.mark.parametrize("command", ["embed-corpus", "apply"])
def test_a_nul_byte_is_found_before_anything_is_written(tmp_path, model, command, inline):
    import spacy

    inputs, output = tmp_path / "in", tmp_path / "out"
    write(inputs / "a.txt", ["fine"])
    write(inputs / "m.txt", ["fine too"])
    (inputs / "z.txt").write_bytes(b"good\nbad \x00 byte\n")
    if command == "apply":
        spacy.blank("en").to_disk(tmp_path / "nlp")
        args = ["apply", str(tmp_path / "nlp"), str(inputs), str(output), "--quiet"]
    else:
        args = ["embed-corpus", str(inputs), str(output), "-m", str(model), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"error: input file {inputs / 'z.txt'}, line 2: not UTF-8 text (a NUL byte at character 5)"
    ]
    assert not output.exists()
