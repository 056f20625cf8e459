"""A biLM is named one way: `--model` with `--options/--weights`, or `pretrain --init-from` with
`--preset/--options`, is a usage error (exit code 2, one line naming both options) before any
work, instead of one of them being ignored."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from spacy_elmo.cli import app

from ..bilm.util import tiny_options, write_random_model


@pytest.fixture
def places(tmp_path):
    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=6)
    text = tmp_path / "input.txt"
    text.write_text("the river bank .\n", encoding="utf-8")
    run = tmp_path / "run"  # a folder --model may name (it need not hold a biLM: never loaded)
    run.mkdir()
    return dict(tmp=tmp_path, options=options, weights=weights, text=text, run=run)


PAIR = ["--options", "{options}", "--weights", "{weights}"]
# (command and its arguments, the options that name the biLM twice, what the line names)
CASES = [
    (["embed", "{text}", "{tmp}/o.hdf5", "--model", "{run}", *PAIR], ("--model", "--options")),
    (["embed", "{text}", "{tmp}/o.hdf5", "-m", "bundled", *PAIR], ("--model", "--options")),
    (["embed", "{text}", "{tmp}/o.hdf5", "-m", "{run}", "--weights", "{weights}"],
     ("--model", "--weights")),
    (["embed-corpus", "{text}", "{tmp}/out", "--model", "{run}", *PAIR], ("--model", "--options")),
    (["probe", "{tmp}/out", "--model", "{run}", *PAIR], ("--model", "--options")),
    (["init-config", "{tmp}/c.cfg", "--model", "{run}", *PAIR], ("--model", "--options")),
    (["pretrain", "{text}", "{tmp}/p", "--init-from", "bundled", "--preset", "tiny"],
     ("--init-from", "--preset")),
    (["pretrain", "{text}", "{tmp}/p", "--init-from", "bundled", "--options", "{options}"],
     ("--init-from", "--options")),
]  # fmt: skip


@pytest.mark.parametrize("argv, named", CASES, ids=[" ".join(c[0][:1] + c[0][3:]) for c in CASES])
def test_a_biLM_named_twice_is_a_usage_error_naming_both(places, argv, named):
    before = sorted(places["tmp"].rglob("*"))
    argv = [a.format(**places) for a in argv]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, (argv, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for option in named:
        assert option in lines[0], lines[0]
    assert "give one" in lines[0]
    assert sorted(places["tmp"].rglob("*")) == before  # nothing written


def test_the_pair_alone_still_names_the_biLM(places):
    """--options/--weights without --model: the pair is the biLM (the check does not fire on
    --model's default)."""
    argv = ["embed", places["text"], places["tmp"] / "o.hdf5", "-q"]
    argv += ["--options", places["options"], "--weights", places["weights"]]
    result = CliRunner().invoke(app, [str(a) for a in argv])
    assert result.exit_code == 0, result.output
    assert (places["tmp"] / "o.hdf5").is_file()
