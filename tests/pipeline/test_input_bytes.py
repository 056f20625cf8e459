"""Every byte of a text input is checked as it is read, not only the first 8 KB: a line that
is not UTF-8 text (an invalid byte, a NUL) well past the start is skipped with a warning and a
count by pretraining, and refused, naming the file and line, by the commands that score or
embed text (perplexity, embed, and the corpus engine's reader)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.corpus.embed_file import LineRange, read_lines
from spacy_elmo.pretrain.corpus import TEXT_PROBE_BYTES, SkippedLines, iter_lines

GOOD = "the river bank flooded the field .\n"
GOOD_LINES = 400  # 14 KB: the bad line starts well past the first TEXT_PROBE_BYTES
BAD_LINE = GOOD_LINES + 1
BAD = {
    "invalid-utf8": b"the \xff\xfe bank flooded .\n",
    "truncated-utf8": b"the caf\xc3 flooded .\n",
    "nul": b"the \x00\x00 bank flooded .\n",
}
# What the pretraining reader says of each bad line's first bad byte.
NAMED = {
    "invalid-utf8": "byte 0xff, which is not UTF-8, at character 5",
    "truncated-utf8": "byte 0xc3, which is not UTF-8, at character 8",
    "nul": "a NUL byte at character 5",
}


def bad_text(path: Path, kind: str) -> Path:
    """GOOD_LINES good lines, the bad line of `kind`, and more good lines."""
    data = (GOOD * GOOD_LINES).encode() + BAD[kind] + (GOOD * 20).encode()
    assert data.index(BAD[kind]) > TEXT_PROBE_BYTES
    path.write_bytes(data)
    return path


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def pretrain_skips(tmp_path: Path, text: Path, caplog, kind: str) -> None:
    run_dir = tmp_path / "run"
    result = run(
        "pretrain", text, run_dir, "--preset", "tiny", "--pretokenized", "--vocab-size", "100",
        "--min-count", "1", "--max-steps", "2", "--batch-tokens", "256", "--dev-every", "10",
        "--eval-every", "2", "--checkpoint-every", "2", "--warmup-steps", "1", "--threads", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((run_dir / "model" / "pretrain.json").read_text())
    assert summary["skipped_lines"] == 1
    warnings = [r.getMessage() for r in caplog.records if "not UTF-8 text" in r.getMessage()]
    assert len(warnings) == 1 and f"{text}, line {BAD_LINE}:" in warnings[0], warnings
    assert "skipped 1 line(s)" in warnings[0] and NAMED[kind] in warnings[0]
    written = (run_dir / "corpus" / "train.txt").read_text(encoding="utf-8")
    written += (run_dir / "corpus" / "dev.txt").read_text(encoding="utf-8")
    assert len(written.splitlines()) == GOOD_LINES + 20  # every good line, the bad one not
    words = (run_dir / "model" / "vocab.txt").read_text(encoding="utf-8").split()
    assert not [w for w in words if "\ufffd" in w or "\x00" in w or w in ("\\xff", "caf")]


def refused(result, text: Path) -> None:
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{text}, line {BAD_LINE}:" in errors[0], result.output
    assert "not UTF-8 text" in errors[0] or "must be UTF-8 text" in errors[0]
    assert "Traceback" not in result.output


def perplexity_refuses(tmp_path: Path, text: Path, caplog, kind: str) -> None:
    output = tmp_path / "ppl.json"
    refused(run("perplexity", text, "--pretokenized", "--output", output), text)
    assert list(tmp_path.iterdir()) == [text]  # no output, no temporary file


def embed_refuses(tmp_path: Path, text: Path, caplog, kind: str) -> None:
    refused(run("embed", text, tmp_path / "out.hdf5"), text)
    assert list(tmp_path.iterdir()) == [text]


def corpus_reader_refuses(tmp_path: Path, text: Path, caplog, kind: str) -> None:
    """embed-corpus and apply read a shard, a range of lines from its byte offset, with
    `read_lines`: a range that starts past the first 8 KB is checked too."""
    first = GOOD_LINES - 10
    lines = LineRange(first=first, offset=first * len(GOOD), count=30)
    with pytest.raises(ValueError, match=f"{text}, line {BAD_LINE}: not UTF-8 text"):
        list(read_lines(text, lines))


COMMANDS = {
    "pretrain-skips": pretrain_skips,
    "perplexity-refuses": perplexity_refuses,
    "embed-refuses": embed_refuses,
    "corpus-reader-refuses": corpus_reader_refuses,
}


@pytest.mark.parametrize("kind", list(BAD))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_bytes_past_the_first_8_kb(tmp_path, caplog, command, kind):
    caplog.set_level(logging.WARNING, logger="spacy_elmo")
    folder = tmp_path / "work"
    folder.mkdir()
    COMMANDS[command](folder, bad_text(folder / "text.txt", kind), caplog, kind)


@pytest.mark.parametrize("kind", list(BAD))
def test_iter_lines_names_the_byte_and_counts_by_file(tmp_path, kind):
    text = bad_text(tmp_path / "text.txt", kind)
    skipped = SkippedLines()
    lines = list(iter_lines([text, text], skipped=skipped))
    assert lines == [GOOD.strip()] * (2 * (GOOD_LINES + 20))
    assert skipped.to_dict() == {"skipped_lines": 2, "skipped_by_file": {str(text): 2}}
    with pytest.raises(ValueError) as caught:
        list(iter_lines([text], not_text="refuse"))
    assert (
        str(caught.value) == f"{text}, line {BAD_LINE}: {NAMED[kind]}; the input must be UTF-8 text"
    )
