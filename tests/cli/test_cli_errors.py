"""Every command's errors pass through one handler: bad arguments give one `error:` line on
standard error, exit code 1, no traceback, and no file written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spacy_elmo.cli import app


@pytest.fixture
def places(tmp_path) -> dict[str, Path]:
    text = tmp_path / "text.txt"
    text.write_text("the river bank .\n", encoding="utf-8")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("one line\n", encoding="utf-8")
    bad_config = tmp_path / "bad.cfg"
    bad_config.write_text("[nlp\nlang = en\n")
    not_json = tmp_path / "options.json"
    not_json.write_text("{not json")
    saved_no_head = tmp_path / "noweights"
    saved_no_head.mkdir()
    assert not (tmp_path / "missing").exists()
    return dict(
        tmp=tmp_path, text=text, blocker=blocker, folder=folder, bad_config=bad_config,
        not_json=not_json, missing=tmp_path / "missing", empty_dir=saved_no_head,
    )  # fmt: skip


CASES = {
    "embed": [
        ["{missing}", "{tmp}/o.hdf5"],
        ["{text}", "{folder}"],
        ["{text}", "{blocker}/o.hdf5"],
        ["{text}", "{tmp}/o.hdf5", "--model", "{missing}"],
        ["{text}", "{tmp}/o.hdf5", "--model", "{empty_dir}"],
        ["{text}", "{tmp}/o.hdf5", "--raw", "--lang", "zz"],
        ["{text}", "{tmp}/o.hdf5", "--threads", "0"],
        ["{text}", "{tmp}/o.hdf5", "--gpu-id", "7"],
        ["{text}", "{tmp}/o.hdf5", "--options", "{not_json}"],
    ],
    "pretrain": [
        ["{missing}", "{tmp}/run"],
        ["{text}", "{tmp}/run", "--preset", "huge"],
        ["{text}", "{tmp}/run", "--options", "{not_json}"],
        ["{text}", "{tmp}/run", "--learning-rate", "-1"],
        ["{text}", "{blocker}/run"],
        ["{text}", "{tmp}/run", "--init-from", "{missing}"],
    ],
    "perplexity": [
        ["{missing}"],
        ["{text}", "--model", "{missing}"],
        ["{text}", "--output", "{blocker}/o.json"],
        ["{text}", "--lang", "zz"],
    ],
    "probe": [
        ["{blocker}"],
        ["{tmp}/out", "--tasks", "ner"],
        ["{tmp}/out", "--assets", "{missing}"],
        ["{tmp}/out", "--model", "{missing}"],
    ],
    "init-config": [
        ["{folder}", "--force"],
        ["{blocker}/c.cfg"],
        ["{tmp}/c.cfg", "--lang", "zz"],
        ["{tmp}/c.cfg", "--components", "tagger,sentiment"],
        ["{tmp}/c.cfg", "--model", "{missing}"],
    ],
    "debug-model": [
        ["{bad_config}", "ner"],
        ["{missing}", "ner"],
    ],
    "embed-corpus": [
        ["{missing}", "{tmp}/out"],
        ["{folder}", "{folder}/out"],
        ["{empty_dir}", "{tmp}/out"],
        ["{folder}", "{tmp}/out", "--model", "{missing}"],
    ],
    "apply": [
        ["no_such_pipeline", "{folder}", "{tmp}/out"],
        ["{missing}", "{folder}", "{tmp}/out"],
        ["blank:en", "{missing}", "{tmp}/out"],
    ],
    "download": [  # names refused before any network; the mirror and cache: below
        ["large"],
        ["{missing}"],
    ],
}
CALLS = [(command, args) for command, cases in CASES.items() for args in cases]


def test_every_command_is_covered():
    commands = {c.name for c in app.registered_commands}
    assert commands == set(CASES)


@pytest.mark.parametrize(
    "command, args", CALLS, ids=[f"{c}:{' '.join(a[1:]) or a[0]}" for c, a in CALLS]
)
def test_bad_arguments_give_one_line_and_no_traceback(places, command, args):
    before = sorted(p for p in places["tmp"].rglob("*"))
    argv = [command, *(a.format(**places) for a in args)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code in (1, 2), (argv, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        argv,
        repr(result.exception),
    )
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code == 1:  # our handler: one line; 2 is click's usage error
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
        assert "internal error" not in lines[0]
    assert sorted(p for p in places["tmp"].rglob("*")) == before, argv


@pytest.mark.parametrize(
    "argv, message",
    [
        (["init-config", "{folder}", "--force"], "output {folder} is a directory, not a file"),
        (
            ["embed-corpus", "{folder}", "{tmp}/out", "--top", "--average"],
            "choose at most one of --top and --average",
        ),
        (
            ["embed", "{text}", "{tmp}/o.hdf5", "--top", "--average"],
            "choose at most one of --top and --average",
        ),
    ],
)
def test_the_error_line_names_what_was_wrong(places, argv, message):
    result = CliRunner().invoke(app, [a.format(**places) for a in argv])
    assert result.exit_code == 1, result.output
    assert result.stderr == f"error: {message.format(**places)}\n"


@pytest.mark.parametrize("setting", ["unreachable mirror", "unwritable cache"])
def test_download_failures_give_one_line_and_leave_no_file(places, monkeypatch, setting):
    """SPACY_ELMO_MIRROR on a port nothing listens on, SPACY_ELMO_CACHE under a file: one
    line, and no file in the cache (nothing is fetched from beyond 127.0.0.1)."""
    cache = places["tmp"] / "cache"
    monkeypatch.setenv("SPACY_ELMO_MIRROR", "http://127.0.0.1:9")
    if setting == "unwritable cache":
        cache = places["blocker"] / "cache"
    monkeypatch.setenv("SPACY_ELMO_CACHE", str(cache))
    result = CliRunner().invoke(app, ["download", "small", "-q"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert (
        "SPACY_ELMO_MIRROR" if setting == "unreachable mirror" else "SPACY_ELMO_CACHE"
    ) in lines[0]
    written = [p for p in places["tmp"].rglob("*") if p.is_file() and cache in p.parents]
    assert [p for p in written if p.suffix != ".lock"] == []  # a lock file is left, no data


@pytest.mark.parametrize("command", ["embed", "embed-corpus"])
def test_a_bad_compression_names_the_option_and_the_allowed_values(places, command):
    before = sorted(places["tmp"].rglob("*"))
    result = CliRunner().invoke(
        app, [command, str(places["text"]), str(places["tmp"] / "out"), "--compression", "zip"]
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--compression': 'zip' is not one of 'gzip', 'lzf'" in result.stderr
    assert "(" not in result.stderr.splitlines()[-1]  # no Python tuple
    assert sorted(places["tmp"].rglob("*")) == before


def test_the_library_names_the_allowed_compressions():
    from spacy_elmo.corpus.embed_file import dataset_options

    with pytest.raises(ValueError, match=r"^compression must be one of 'gzip', 'lzf' .*got 'zip'$"):
        dataset_options(compression="zip")


def test_download_offline_ends_in_one_sentence(tmp_path):
    """`spacy-elmo download` where no network is reachable (a private network namespace): one
    line that says what to do, exit code 1, no traceback."""
    import os
    import subprocess
    import sys

    from ..private_network import private_network

    env = {**os.environ, "SPACY_ELMO_CACHE": str(tmp_path / "cache")}
    for variable in ("SPACY_ELMO_MIRROR", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        env.pop(variable, None)
    ended = subprocess.run(
        [*private_network(), sys.executable, "-m", "spacy_elmo.cli", "download", "small", "-q"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert ended.returncode == 1, ended.stderr
    assert ended.stderr.count("\n") == 1 and "Traceback" not in ended.stderr, ended.stderr
    assert ended.stderr.startswith("error: cannot reach https://"), ended.stderr
    assert "offline or behind a proxy? set SPACY_ELMO_MIRROR" in ended.stderr
