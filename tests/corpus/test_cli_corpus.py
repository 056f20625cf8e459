"""`spacy-elmo embed-corpus` and `spacy-elmo apply` as commands (cases that need no Ray start)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from spacy_elmo.cli import app

OPTIONS = {
    "embed-corpus": [
        "--model",
        "-m",
        "--options",
        "--weights",
        "--top",
        "--average",
        "--pretokenized",
        "--raw",
        "--lang",
        "-l",
        "--max-tokens",
        "--batch-size",
        "-b",
        "--float16",
        "--compression",
        "--shard-lines",
        "--workers",
        "--address",
        "--threads-per-worker",
        "--gpus-per-worker",
        "--quiet",
        "-q",
    ],
    "apply": [
        "--text-key",
        "--batch-size",
        "--gpu-id",
        "-g",
        "--shard-docs",
        "--workers",
        "--address",
        "--threads-per-worker",
        "--gpus-per-worker",
        "--quiet",
    ],
}


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_help_has_the_shared_vocabulary(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    for option in OPTIONS[command]:
        assert f"{option} " in result.output or f"{option}," in result.output, option


def test_bad_input_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(b"ok\n\xc3\x28 broken\n")
    result = run("embed-corpus", str(tmp_path / "in"), str(tmp_path / "out"), "-q")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: input file {tmp_path / 'in' / 'a.txt'}, line 2: not UTF-8 text "
        "(invalid continuation byte at byte 0)"
    ]
    assert not (tmp_path / "out" / "a.hdf5").exists()


def test_apply_names_a_missing_pipeline(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    result = run("apply", str(tmp_path / "nope"), str(tmp_path / "a.txt"), str(tmp_path / "o"))
    assert result.exit_code == 1
    assert "neither a folder nor an installed spaCy package" in result.output


def test_without_ray_the_command_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a b\n")
    monkeypatch.setitem(sys.modules, "ray", None)
    result = run("embed-corpus", str(tmp_path / "in"), str(tmp_path / "out"), "--workers", "1")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: corpus commands run on Ray, which is not installed: pip install 'ray>=2.60,<3' "
        "(in a clone of spacy-elmo's source: pip install -e '.[ray]')"
    )


@pytest.mark.parametrize(
    "command, runner, unit",
    [
        ("apply", "apply.apply_corpus", "documents"),
        ("embed-corpus", "embed.embed_corpus", "sentences"),
    ],
)
def test_the_report_counts_what_the_command_reads(tmp_path, monkeypatch, command, runner, unit):
    """apply's inputs are documents, embed-corpus's sentences: the closing line says which (the
    run itself replaced by one that reports 5 lines embedded in 2 s on 1 worker)."""
    import importlib

    from spacy_elmo.corpus.engine import RunStats
    from spacy_elmo.corpus.runner import CorpusResult

    stats = RunStats(run_seconds=2.0, lines=5, workers={"host:1"})
    done = CorpusResult(written=["a.out"], stats=stats)
    module, function = runner.split(".")
    monkeypatch.setattr(
        importlib.import_module(f"spacy_elmo.corpus.{module}"), function, lambda *a, **k: done
    )
    args = ["blank:en"] if command == "apply" else []
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one line\n", encoding="utf-8")
    result = run(command, *args, str(tmp_path / "in"), str(tmp_path / "out"), "-q")
    assert result.exit_code == 0, result.output
    assert f"wrote 1 outputs (5 {unit}, 2.5/s on 1 workers" in result.output


@pytest.mark.parametrize(
    "given", [[], ["--pretokenized"], ["--raw"]], ids=["default", "tokens", "raw"]
)
def test_embed_corpus_warns_of_raw_looking_text_as_embed_does(tmp_path, given, inline, bilm_dir):
    """The default reads lines as tokens: a line that looks like raw text gets `embed`'s
    warning, once for the corpus; saying which kind the input is silences it."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("the cat sat .\n", encoding="utf-8")
    (tmp_path / "in" / "b.txt").write_text("Hello, world.\nIt's raw.\n", encoding="utf-8")
    result = run(
        "embed-corpus", str(tmp_path / "in"), str(tmp_path / "out"), "-m", str(bilm_dir), "-q",
        *given,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    warning = (
        f"warning: {tmp_path / 'in' / 'b.txt'} line 1 has the token 'Hello,', which looks like "
        "raw text; lines are split on spaces only: give --raw (and --lang) to tokenise them\n"
    )
    assert result.stderr == (warning if given == [] else "")
