"""`spacy-elmo debug-model` takes the flags of spaCy's `spacy debug model`, and spaCy's own command
on an elmo config ends with an error that says to run `spacy-elmo debug-model` instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from spacy_elmo.cli import app

from ..pipeline.pipeline_util import tiny_training_config, write_train_dev

ROOT = Path(__file__).resolve().parents[2]


def spacy_debug_model_flags() -> dict[str, set[str]]:
    """spaCy's `debug model`: each option's long flag -> all its flags."""
    from spacy.cli import app as spacy_app

    command = typer.main.get_command(spacy_app).commands["debug"].commands["model"]
    return {
        next(o for o in p.opts if o.startswith("--")): set(p.opts)
        for p in command.params
        if p.opts[0].startswith("-") and p.name != "help"
    }


def test_debug_model_takes_every_flag_of_spacy_debug_model():
    ours = typer.main.get_command(app).commands["debug-model"]
    flags = {next(o for o in p.opts if o.startswith("--")): set(p.opts) for p in ours.params
             if p.opts[0].startswith("-")}  # fmt: skip
    theirs = spacy_debug_model_flags()
    assert "-l" in theirs["--layers"]  # what spaCy 3.8 has
    for long, same in theirs.items():
        assert same <= flags.get(long, set()), (long, same, flags.get(long))


def test_debug_model_prints_the_layers_named_with_l(bilm_dir, tmp_path):
    train, dev = write_train_dev(tmp_path, 10, 4)
    tiny_training_config(bilm_dir, train, dev).to_disk(tmp_path / "config.cfg")
    result = CliRunner().invoke(
        app, ["debug-model", str(tmp_path / "config.cfg"), "ner", "-l", "0", "-DIM", "-P0"]
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    printed = [line for line in result.output.splitlines() if "Layer " in line]
    assert printed and all(line.split("Layer ")[1].startswith("0") for line in printed), printed


def test_spacy_debug_model_on_an_elmo_config_says_to_run_spacy_elmo_debug_model(bilm_dir, tmp_path):
    train, dev = write_train_dev(tmp_path, 10, 4)
    tiny_training_config(bilm_dir, train, dev).to_disk(tmp_path / "config.cfg")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "spacy", "debug", "model", str(tmp_path / "config.cfg"), "ner"],
        capture_output=True, text=True, env=environment, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: doc._.elmo_layers is not set"), result.stderr[-2000:]
    assert "run `spacy-elmo debug-model CONFIG COMPONENT` instead" in last
