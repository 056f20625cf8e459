"""The shared file helpers (util/files.py): sha256 in blocks, the lock on a file, atomic writes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spacy_elmo.util import files
from spacy_elmo.util.files import (
    HASH_BLOCK_BYTES,
    LockHeld,
    atomic_path,
    file_sha256,
    files_sha256,
    lock_file,
    write_text,
)

pytest.importorskip("fcntl")

# Loads util/files.py (argv[1]) alone, without the package and its torch; takes the lock on
# argv[2] with argv[3] as its holder's text, says so, and holds it until it is killed.
HOLD_LOCK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("files", sys.argv[1])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
lock = files.lock_file(sys.argv[2], sys.argv[3])
print("locked", flush=True)
sys.stdin.read()
"""


def test_file_sha256_is_hashlibs_over_more_than_one_block(tmp_path: Path):
    data = os.urandom(2 * HASH_BLOCK_BYTES + 12_345)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_files_sha256_is_each_name_a_nul_and_the_bytes(tmp_path: Path):
    first, second = os.urandom(HASH_BLOCK_BYTES + 7), b"second file"
    (tmp_path / "a").write_bytes(first)
    (tmp_path / "b").write_bytes(second)
    expected = hashlib.sha256(b"a\0" + first + b"b\0" + second).hexdigest()
    assert files_sha256([(b"a", tmp_path / "a"), (b"b", tmp_path / "b")]) == expected
    # the same bytes under other names, or split otherwise between files, differ
    assert files_sha256([(b"c", tmp_path / "a"), (b"b", tmp_path / "b")]) != expected


def test_a_lock_refuses_a_second_holder_in_another_process_until_it_dies(tmp_path: Path):
    path = tmp_path / "run.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, files.__file__, str(path), "held by the other process\n"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockHeld) as refused:
            lock_file(path, "this process\n")
        assert refused.value.path == path
        assert refused.value.text == "held by the other process\n"
        assert isinstance(refused.value, BlockingIOError)
        assert path.read_text() == "held by the other process\n"  # the refusal wrote nothing
    finally:
        holder.kill()  # SIGKILL: no code of its own releases the lock
        holder.wait()
        holder.stdout.close()
        holder.stdin.close()
    with lock_file(path, "this process\n") as lock:  # the kernel dropped the dead holder's lock
        assert Path(lock.lock_file) == path
        assert path.read_text() == "this process\n"


def test_a_lock_is_exclusive_between_open_files_and_released_by_release(tmp_path: Path):
    path = tmp_path / "data.part"
    path.write_bytes(b"contents that stay")
    lock = lock_file(path)  # no holder: the file is locked for its own contents
    with pytest.raises(LockHeld) as refused:
        lock_file(path)
    assert refused.value.text == "contents that stay"
    lock.release()
    lock.release()  # a second release does nothing
    with lock_file(path):
        pass
    assert path.read_bytes() == b"contents that stay"


def test_a_lock_on_a_file_that_cannot_be_opened_is_an_oserror(tmp_path: Path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(OSError):
        lock_file(tmp_path / "a_file" / "x.lock")


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path: Path):
    path = tmp_path / "record.json"
    write_text(path, "old\n")
    with pytest.raises(RuntimeError, match="cut"):
        with atomic_path(path) as tmp:
            tmp.write_text("half of the new")
            assert tmp.parent == tmp_path and tmp.name.startswith(".record.json.")
            raise RuntimeError("cut")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
    assert path.read_text() == "old\n"
    write_text(path, "new\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
    assert path.read_text() == "new\n"


# --------------------------------------------------------------------- a folder's place
def test_place_resolves_links_and_dotdot(tmp_path):
    model = tmp_path / "models" / "bilm"
    (model / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(model)
    (tmp_path / "deep").symlink_to(model / "sub")
    # by name: tmp_path/deep/.. is tmp_path; on disk it is the model's folder
    aliases = {
        "is": [model, tmp_path / "link", tmp_path / "deep" / "..", model / "sub" / ".."],
        "is inside": [model / "out", tmp_path / "link" / "new" / "out", tmp_path / "deep"],
        "contains": [model.parent, tmp_path / "link" / "..", tmp_path],
        None: [tmp_path / "models" / "other", tmp_path / "deep" / "../../other"],
    }
    for want, paths in aliases.items():
        for path in paths:
            assert files.place(path, model) == want, path


def test_an_output_that_is_the_input_by_another_name_is_refused(tmp_path):
    """A hard link is the same file under another name: writing the output would replace the
    input (no name tells them apart, their identity does)."""
    text = tmp_path / "input.txt"
    text.write_text("the river bank .\n", encoding="utf-8")
    os.link(text, tmp_path / "out.hdf5")
    with pytest.raises(ValueError, match=r"output .*out\.hdf5 is the input .*input\.txt"):
        files.check_output(tmp_path / "out.hdf5", [text])
