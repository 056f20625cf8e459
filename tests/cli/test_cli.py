"""`spacy-elmo embed`: the hdf5 layout of the old `allennlp elmo` command, and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.cli import app

from ..pipeline.pipeline_util import save_tiny_bilm

LINES = ["The river bank overflowed .", "", "Don 't   stop !", "北京 😀"]


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("flag", [None, "--top", "--average"])
def test_embed_writes_one_dataset_per_line(setup, flag):
    tmp_path, options, weights, text = setup
    out = tmp_path / "out.hdf5"
    args = ["embed", text, out, "--options", options, "--weights", weights, "-b", "2", "-q"]
    result = run(*args, *([flag] if flag else []))
    assert result.exit_code == 0, result.output
    expected = BiLM.from_allennlp(options, weights).embed([line.split() for line in LINES])
    with h5py.File(out, "r") as f:
        assert sorted(f) == ["0", "1", "2", "3", "sentence_to_index"]
        for i, layers in enumerate(expected):
            want = {None: layers, "--top": layers[-1], "--average": layers.mean(0)}[flag]
            np.testing.assert_allclose(f[str(i)][...], want, atol=1e-5, rtol=0)
        mapping = json.loads(f["sentence_to_index"][0])
    assert mapping == {line: str(i) for i, line in enumerate(LINES)}


def test_embed_from_a_saved_model_with_spacy_tokenizer(setup):
    tmp_path, options, weights, text = setup
    bilm = BiLM.from_allennlp(options, weights)
    bilm.save(tmp_path / "saved")
    raw = tmp_path / "raw.txt"
    raw.write_text("Don't stop, it's 5pm.\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result = run("embed", raw, out, "--model", tmp_path / "saved", "--raw", "-q")
    assert result.exit_code == 0, result.output
    tokens = ["Do", "n't", "stop", ",", "it", "'s", "5", "pm", "."]
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["0"][...], bilm.embed([tokens])[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["{missing}", "--options", "{options}", "--weights", "{weights}"], "does not exist"),
        (["{binary}", "--options", "{options}", "--weights", "{weights}"], "not UTF-8"),
        (["{text}", "--options", "{options}", "--weights", "{options}"], "HDF5"),
        (["{text}", "--options", "{options}"], "needs its weights file too"),
        (["{text}", "--model", "{missing}"], "missing does not exist"),
        (
            ["{text}", "--options", "{options}", "--weights", "{weights}", "--top", "--average"],
            "at most one",
        ),
    ],
)
def test_embed_errors_are_clear(setup, args, message):
    tmp_path, options, weights, text = setup
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"ok\n\xff\xfe\n")
    names = dict(
        missing=tmp_path / "missing", binary=binary, text=text, options=options, weights=weights
    )
    result = run(
        "embed",
        *(a.format(**names) for a in args[:1]),
        tmp_path / "o.hdf5",
        *(a.format(**names) for a in args[1:]),
    )
    assert result.exit_code == 1
    assert message in result.output


def test_console_script_is_installed():
    """The `spacy-elmo` entry point itself, as pip installed it beside this interpreter."""
    script = Path(sys.executable).parent / "spacy-elmo"
    assert script.is_file(), f"{script} is missing: is spacy-elmo installed (pip install -e .)?"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for command in ("embed", "pretrain", "perplexity"):
        assert command in result.stdout


def test_pretrain_options_are_the_run_settings():
    """`spacy-elmo pretrain` has one option (or argument) per PretrainConfig field, under the
    field's name and with its default, and nothing else but what to do with the run
    directory; the settings the command builds are accepted by PretrainConfig."""
    from dataclasses import MISSING, fields

    import typer

    from spacy_elmo.cli.pretrain import NOT_SETTINGS, settings
    from spacy_elmo.pretrain import PretrainConfig

    fields_ = {f.name: f for f in fields(PretrainConfig)}
    params = {p.name: p for p in typer.main.get_command(app).commands["pretrain"].params}
    assert set(params) - set(NOT_SETTINGS) == set(fields_)
    for name, field in fields_.items():
        if field.default is not MISSING and name not in ("lang", "pretokenized"):
            assert params[name].default == field.default, name
    values = {name: param.default for name, param in params.items()}
    values.update(inputs=[Path("a.txt")], output=Path("run"), dev=None)
    config = PretrainConfig(**settings(values))
    assert config.lang == "en" and config.pipeline is None
    assert config.inputs == ["a.txt"] and config.output == "run"
    assert config.pretokenized is False  # pretrain reads raw text unless told otherwise
    values.update(pretokenized=None, lang="de")
    assert PretrainConfig(**settings(values)).lang == "de"


@pytest.mark.parametrize(
    "given, lang, pipeline, default, expected",
    [
        (None, None, None, True, True),  # the command's default
        (None, None, None, False, False),
        (None, "de", None, True, False),  # naming a tokenizer means raw text
        (None, None, "en_core_web_sm", True, False),
        (False, None, None, True, False),
        (True, None, None, False, True),
    ],
)
def test_pretokenized_or_raw(given, lang, pipeline, default, expected):
    from spacy_elmo.cli._util import is_pretokenized

    assert is_pretokenized(given, lang, pipeline, default) is expected


def test_a_tokenizer_named_for_pretokenized_input_is_an_error():
    from spacy_elmo.cli._util import is_pretokenized

    with pytest.raises(ValueError, match="give one or the other"):
        is_pretokenized(True, "de", None, True)


def test_embed_with_lang_tokenises_and_raw_looking_input_warns(setup):
    tmp_path, options, weights, _ = setup
    raw = tmp_path / "raw.txt"
    raw.write_text("He left the office.\nno punctuation here\n", encoding="utf-8")
    pair = ["--options", options, "--weights", weights, "-q"]
    result = run("embed", raw, tmp_path / "a.hdf5", *pair)
    assert result.exit_code == 0, result.output
    assert "line 1 has the token 'office.'" in result.stderr
    result = run("embed", raw, tmp_path / "b.hdf5", *pair, "--lang", "en")
    assert result.exit_code == 0 and "warning" not in result.stderr
    with h5py.File(tmp_path / "a.hdf5") as split, h5py.File(tmp_path / "b.hdf5") as tokenised:
        assert split["0"].shape[1] == 4 and tokenised["0"].shape[1] == 5  # "office" "."


@pytest.mark.parametrize("case", ["inside-by-dotdot", "init-from-by-link"])
def test_pretrain_refuses_a_run_directory_over_its_inputs(tmp_path, case):
    """The run directory is known with its links and `..` resolved: inside the corpus folder
    (named through a link and `..`) or the biLM it adapts (through a link): refused before
    anything is written."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the river bank .\n" * 20, encoding="utf-8")
    args = ["--preset", "tiny", "--max-steps", "1", "--min-count", "1", "-q"]
    if case == "inside-by-dotdot":
        (corpus / "sub").mkdir()
        (tmp_path / "deep").symlink_to(corpus / "sub")
        output, want = tmp_path / "deep" / ".." / "run", "is inside the input"
    else:
        model = tmp_path / "bilm"
        save_tiny_bilm(model)
        (tmp_path / "link").symlink_to(model)
        output, want = tmp_path / "link", "is the --init-from biLM"
        args = [a for a in args if a not in ("--preset", "tiny")]  # the architecture is model's
        args += ["--init-from", str(model)]
        corpus = corpus / "a.txt"
    before = sorted(tmp_path.rglob("*"))
    result = subprocess.run(
        [sys.executable, "-m", "spacy_elmo.cli", "pretrain", str(corpus), str(output),
         *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: output folder {output} {want}"), result.stderr
    assert sorted(tmp_path.rglob("*")) == before
