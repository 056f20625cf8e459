"""Flags mean what they mean in spaCy's CLI: `-c` is `--code`, `init-config -p` the component
list (`spacy init config --pipeline`), `apply` takes `spacy apply`'s options that fit, and the
help says the defaults that the code has."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from spacy_elmo.cli import app

from ..bilm.util import tiny_options, write_random_model

# The commands that load a spaCy pipeline or config (or a tokenizer's language).
LOADERS = ("apply", "debug-model", "embed", "embed-corpus", "init-config", "perplexity", "pretrain")
# A custom language that only the --code file registers (a code a test, as the registry is
# shared by every test of this process).
CODE = """
from spacy.language import Language
from spacy.util import registry


@registry.languages("{lang}")
class Custom(Language):
    lang = "{lang}"
"""


def commands() -> dict:
    return typer.main.get_command(app).commands


def flags(name: str) -> dict[str, str]:
    """Every flag of command `name` -> the parameter it sets."""
    return {
        flag: param.name
        for param in commands()[name].params
        for flag in [*param.opts, *getattr(param, "secondary_opts", [])]
    }


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("name", sorted(commands()))
def test_c_is_code_wherever_it_is_taken(name):
    assert flags(name).get("-c", "code") == "code"


@pytest.mark.parametrize("name", LOADERS)
def test_every_command_that_loads_a_pipeline_or_config_takes_code(name):
    assert flags(name).get("--code") == "code" and flags(name).get("-c") == "code"


def test_init_config_names_its_components_as_spacy_init_config_does():
    for flag in ("--pipeline", "-p", "--components"):  # the old long spelling is kept
        assert flags("init-config")[flag] == "components"


def test_apply_takes_the_options_of_spacy_apply_that_fit():
    apply = flags("apply")
    assert apply["-tk"] == apply["--text-key"] == "text_key"
    assert apply["-n"] == apply["--n-process"] == apply["--workers"] == "workers"
    assert apply["-b"] == "batch_size" and apply["-g"] == "gpu_id" and apply["-c"] == "code"


@pytest.mark.parametrize("name", ["apply", "embed", "pretrain", "probe"])
def test_quiet_is_shared(name):
    assert flags(name)["-q"] == flags(name)["--quiet"] == "quiet"


@pytest.mark.parametrize(
    "name, said, unsaid",
    [
        ("embed", "Default: --pretokenized, or --raw when --lang or --pipeline is given.", None),
        ("perplexity", "Default: --raw.", "or --raw when"),
        ("pretrain", "Default: --raw.", "or --raw when"),
    ],
)
def test_the_help_says_the_default_of_pretokenized_that_the_code_has(name, said, unsaid):
    from spacy_elmo.cli._util import is_pretokenized

    option = next(p for p in commands()[name].params if p.name == "pretokenized")
    default = said.startswith("Default: --pretokenized")
    assert is_pretokenized(None, None, None, {"embed": True}.get(name, False)) is default
    text = " ".join(option.help.split())
    assert said in text
    assert unsaid is None or unsaid not in text


def test_init_config_imports_code_that_registers_a_language(tmp_path):
    # "zx": a language no other test names (what --code registers stays for the process)
    code = tmp_path / "custom.py"
    code.write_text(CODE.format(lang="zx"), encoding="utf-8")
    without = invoke("init-config", tmp_path / "a.cfg", "-p", "ner", "--lang", "zx")
    assert without.exit_code == 1 and "zx" in without.output
    result = invoke("init-config", tmp_path / "b.cfg", "-p", "ner", "--lang", "zx", "-c", code)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "b.cfg").read_text(encoding="utf-8")
    assert 'lang = "zx"' in text and 'pipeline = ["elmo", "ner"]' in text


def test_embed_tokenises_with_a_language_its_code_registers(tmp_path):
    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=3)
    code = tmp_path / "custom.py"
    code.write_text(CODE.format(lang="zy"), encoding="utf-8")
    text = tmp_path / "in.txt"
    text.write_text("Don't stop.\n", encoding="utf-8")
    pair = ["--options", options, "--weights", weights, "-q", "--lang", "zy"]
    assert invoke("embed", text, tmp_path / "a.hdf5", *pair).exit_code == 1
    result = invoke("embed", text, tmp_path / "b.hdf5", *pair, "--code", code)
    assert result.exit_code == 0, result.output


def test_a_missing_code_file_is_named(tmp_path):
    assert not (tmp_path / "nowhere.py").exists()
    result = invoke("init-config", tmp_path / "a.cfg", "-c", tmp_path / "nowhere.py")
    assert result.exit_code == 1
    assert f"--code {tmp_path / 'nowhere.py'}: no such Python file" in result.output


def test_apply_workers_import_the_code_before_loading_the_pipeline(tmp_path):
    """What each Ray worker runs first (`ApplyJob.setup`): the code, then the pipeline. The
    pipeline is written by another process: its component is not registered in this one."""
    from spacy_elmo.corpus.apply import ApplyJob

    code = tmp_path / "component.py"
    code.write_text(
        "from spacy.language import Language\n\n\n"
        "@Language.component('marks_that_the_code_ran')\n"
        "def marks(doc):\n    doc.user_data['marked'] = True\n    return doc\n",
        encoding="utf-8",
    )
    write = (
        "import sys, spacy; spacy.util.import_file('python_code', sys.argv[1]); "
        "nlp = spacy.blank('en'); nlp.add_pipe('marks_that_the_code_ran'); "
        "nlp.to_disk(sys.argv[2])"
    )
    pipeline = tmp_path / "pipeline"
    subprocess.run([sys.executable, "-c", write, str(code), str(pipeline)], check=True)
    with pytest.raises(ValueError, match="marks_that_the_code_ran"):
        ApplyJob(str(pipeline)).setup()
    loaded = ApplyJob(str(pipeline), code=str(code)).setup()
    assert loaded("a test").user_data["marked"] is True


def test_embed_corpus_workers_import_the_code_before_they_tokenise(tmp_path, monkeypatch):
    """`embed-corpus --code` imports the file in the command and hands it to every worker
    (`EmbedJob.setup`, here run in this process in place of Ray): a language that only the file
    registers tokenises raw text there."""
    from spacy_elmo.corpus import embed
    from spacy_elmo.corpus.runner import CorpusResult

    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=3)
    code = tmp_path / "custom.py"
    code.write_text(CODE.format(lang="zw"), encoding="utf-8")
    (tmp_path / "in.txt").write_text("Don't stop.\n", encoding="utf-8")
    with pytest.raises(ImportError, match="zw"):  # without the file, no worker knows the language
        embed.EmbedJob(None, str(options), str(weights), pretokenized=False, lang="zw").setup()
    jobs = []
    monkeypatch.setattr(embed, "run_corpus", lambda *args: jobs.append(args[3]) or CorpusResult())
    pair = ["--options", options, "--weights", weights, "-q", "--lang", "zw"]
    result = invoke("embed-corpus", tmp_path / "in.txt", tmp_path / "out", *pair, "-c", code)
    assert result.exit_code == 0, result.output
    (job,) = jobs
    assert job.code == str(code.resolve()) and job.lang == "zw" and not job.pretokenized
    _, tokenize = job.setup()
    # the custom language's rules: spaCy's default punctuation, no English exceptions ("Do n't")
    assert tokenize("Don't stop.") == ["Don't", "stop", "."]


@pytest.mark.parametrize(
    "command",
    [
        ["embed", "{tmp}/in.txt", "{tmp}/out.hdf5"],
        ["probe", "{tmp}/probe"],
        ["debug-model", "{tmp}/config.cfg", "ner"],
        ["apply", "blank:en", "{tmp}/in.txt", "{tmp}/out"],
        ["pretrain", "{tmp}/in.txt", "{tmp}/run"],
    ],
    ids=lambda command: command[0],
)
def test_a_gpu_id_without_cuda_is_one_clear_error_before_any_work(tmp_path, monkeypatch, command):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "in.txt").write_text("a line .\n", encoding="utf-8")
    (tmp_path / "config.cfg").write_text("[nlp]\n", encoding="utf-8")
    result = invoke(*[arg.format(tmp=tmp_path) for arg in command], "-g", "0")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: --gpu-id 0: no CUDA device is available on this machine (use -1 for the CPU)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.cfg", "in.txt"]


def test_embed_dash_reads_standard_input(tmp_path):
    import h5py
    import numpy as np

    from spacy_elmo import BiLM

    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=4)
    lines = ["The river bank flooded .", "A second line"]
    text = "\n".join(lines) + "\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    pair = ["--options", str(options), "--weights", str(weights), "-q"]
    from_stdin = CliRunner().invoke(
        app, ["embed", "-", str(tmp_path / "a.hdf5"), *pair], input=text
    )
    assert from_stdin.exit_code == 0, from_stdin.output
    assert "wrote 2 sentences" in from_stdin.output
    assert invoke("embed", tmp_path / "in.txt", tmp_path / "b.hdf5", *pair).exit_code == 0
    expected = BiLM.from_allennlp(options, weights).embed([line.split() for line in lines])
    with h5py.File(tmp_path / "a.hdf5") as a, h5py.File(tmp_path / "b.hdf5") as b:
        assert sorted(a) == sorted(b) == ["0", "1", "sentence_to_index"]
        for i, layers in enumerate(expected):
            np.testing.assert_allclose(a[str(i)][...], layers, atol=1e-5, rtol=0)
        assert a["sentence_to_index"][0] == b["sentence_to_index"][0]


def test_embed_dash_names_standard_input_in_its_warning(tmp_path):
    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=4)
    pair = ["--options", str(options), "--weights", str(weights), "-q"]
    result = CliRunner().invoke(
        app, ["embed", "-", str(tmp_path / "a.hdf5"), *pair], input="He left the office.\n"
    )
    assert result.exit_code == 0, result.output
    assert "standard input line 1 has the token 'office.'" in result.stderr


def test_a_bad_byte_read_from_standard_input_is_named_by_its_line(tmp_path):
    """`embed -` copies standard input to a temporary file first; a bad byte is reported
    against standard input and the line it is on, never the copy's path."""
    options, weights = write_random_model(tmp_path / "model", tiny_options(), seed=4)
    pair = ["--options", str(options), "--weights", str(weights), "-q"]
    text = b"the river bank .\na second line\nbad \xff byte\n"
    result = CliRunner().invoke(app, ["embed", "-", str(tmp_path / "a.hdf5"), *pair], input=text)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "error: standard input, line 3: not UTF-8 text (invalid start byte at byte 4)\n"
    )
    assert not (tmp_path / "a.hdf5").exists()


def test_the_shipped_example_is_pretokenised_as_embed_reads_it():
    """examples/sentences.txt (the README's `embed` example) draws no raw-text warning."""
    from pathlib import Path

    from spacy_elmo.corpus.embed_file import raw_looking_token

    example = Path(__file__).resolve().parents[2] / "examples" / "sentences.txt"
    assert raw_looking_token(example) is None


@pytest.mark.parametrize("name", ["embed", "embed-corpus"])
def test_max_tokens_defaults_to_the_window_of_the_library(name):
    from spacy_elmo.corpus.embed_file import MAX_TOKENS

    option = next(p for p in commands()[name].params if p.name == "max_tokens")
    assert option.default == MAX_TOKENS
