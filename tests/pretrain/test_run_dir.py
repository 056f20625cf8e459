"""A run directory belongs to one run; checkpoints load without unpickling; resume keeps the
run's settings; bad settings and files are messages, not tracebacks."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain.checkpoint import load_checkpoint, locked_run_directory
from spacy_elmo.pretrain.trainer import Pretrainer

from ..test_faults import Exploit, malicious_pickle
from .test_pretrain import cli_args, short_config, weights_of, write_corpus


def invoke(*args) -> object:
    return CliRunner().invoke(app, ["pretrain", *[str(a) for a in args]])


# ---------------------------------------------------------------------- 1. checkpoints
@pytest.mark.parametrize("layout", ["zip", "legacy"])
def test_a_malicious_checkpoint_runs_nothing(finished_run, tmp_path, layout):
    config, run = finished_run
    marker = tmp_path / "marker"
    checkpoint = run / "checkpoints" / "last.pt"
    if layout == "zip":  # torch.save's archive, the object pickled inside
        torch.save({"step": Exploit(marker)}, checkpoint)
    else:
        checkpoint.write_bytes(malicious_pickle(marker))
    with pytest.raises(ValueError, match=f"refusing to load checkpoint {checkpoint}"):
        load_checkpoint(checkpoint)
    result = invoke(*cli_args(Path(config.inputs[0]), run, max_steps=6), "--resume")
    assert result.exit_code == 1
    assert f"error: refusing to load checkpoint {checkpoint}" in result.output
    assert not marker.exists()
    # The control: unpickling the file does run code.
    if layout == "zip":
        torch.load(checkpoint, weights_only=False)
    else:
        pickle.loads(checkpoint.read_bytes())
    assert marker.exists()


def test_checkpoints_load_with_weights_only(finished_run):
    _, run = finished_run
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["format"] == "spacy-elmo-pretrain-checkpoint" and state["step"] == 4


def test_a_checkpoint_of_the_earlier_layout_still_resumes(finished_run):
    """Earlier versions wrote the same plain types without the format keys."""
    config, run = finished_run
    path = run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    del state["format"], state["version"]
    torch.save(state, path)
    summary = pretrain(replace(config, max_steps=6), resume=True)
    assert summary["steps"] == 6


# What a checkpoint of the version with the transformer teacher holds for a run without one.
TEACHER_SETTINGS = {
    "teacher": None,
    "teacher_layer": -1,
    "teacher_weight": 1.0,
    "teacher_store": None,
    "teacher_store_max_gb": 20.0,
}


def test_a_checkpoint_with_the_retired_teacher_settings_resumes(finished_run, tmp_path):
    """A run without a teacher resumes from a checkpoint that names the teacher's settings, to
    the same weights as from one that does not; a run with a teacher is refused."""
    config, run = finished_run
    other = tmp_path / "copy"
    shutil.copytree(run, other)
    path = run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    state["config"].update(TEACHER_SETTINGS)
    torch.save(state, path)
    pretrain(replace(config, max_steps=6), resume=True)
    pretrain(replace(config, output=str(other), max_steps=6), resume=True)
    resumed, reference = weights_of(run), weights_of(other)
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[name], reference[name]) for name in reference)
    state["config"]["teacher"] = "assets/minilm/all-MiniLM-L6-v2"
    torch.save(state, path)
    with pytest.raises(ValueError, match="a run with a transformer teacher .* no longer has"):
        pretrain(replace(config, max_steps=8), resume=True)


@pytest.mark.parametrize("damage", ["empty", "truncated", "nan"])
def test_a_damaged_checkpoint_is_a_message(finished_run, damage):
    config, run = finished_run
    path = run / "checkpoints" / "last.pt"
    if damage == "nan":
        state = torch.load(path, weights_only=True)
        state["model"]["head.softmax.bias"][0] = float("nan")
        torch.save(state, path)
    else:
        data = path.read_bytes()
        path.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    message = {
        "empty": "is empty",
        "truncated": "truncated or corrupted",
        "nan": "tensor 'head.softmax.bias' contains NaN",
    }[damage]
    result = invoke(*cli_args(Path(config.inputs[0]), run, max_steps=6), "--resume")
    assert result.exit_code == 1, result.output
    assert f"checkpoint {path}" in result.output and message in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------- 3. run directories
def test_a_locked_run_directory_is_refused_at_once(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    config = short_config(tmp_path, corpus)
    with locked_run_directory(Path(config.output)):
        with pytest.raises(ValueError, match=f"{config.output} is in use .*pid {os.getpid()}"):
            pretrain(config)
    assert not (Path(config.output) / "corpus").exists()


def test_a_run_directory_held_by_another_process_is_refused(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run / "pretrain.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = invoke(*cli_args(corpus, run))
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 1
    assert f"run directory {run} is in use by another pretraining run (pid {holder.pid}" in (
        result.output
    )


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
time.sleep(60)
"""


def test_an_unusable_output_directory_fails_before_any_work(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    result = invoke(*cli_args(corpus, blocker / "run"))
    assert result.exit_code == 1 and f"cannot use run directory {blocker / 'run'}" in result.output


def test_an_existing_run_is_refused_unless_resumed_or_overwritten(finished_run, tmp_path):
    config, run = finished_run
    other = tmp_path / "other.txt"
    other.write_text("a brand new sentence .\n" * 300, encoding="utf-8")
    changed = replace(config, inputs=[str(other)], vocab_size=6)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="already holds a run .*with --resume, .* with --force"):
        pretrain(changed)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    pretrain(changed, overwrite=True)
    assert "brand new sentence" in (run / "corpus" / "train.txt").read_text()
    assert len((run / "vocab.txt").read_text().split()) == 6
    with pytest.raises(ValueError, match="resume continues a run and overwrite deletes it"):
        pretrain(changed, resume=True, overwrite=True)


def test_resume_keeps_the_saved_max_steps_unless_given(finished_run):
    config, _ = finished_run
    assert Pretrainer(replace(config, max_steps=None), resume=True).config.max_steps == 4
    assert Pretrainer(replace(config, max_steps=9), resume=True).config.max_steps == 9


def test_resume_refuses_other_settings(finished_run):
    config, run = finished_run
    with pytest.raises(ValueError, match=r"learning_rate is 0\.5, the run was started with 0\.01"):
        Pretrainer(replace(config, learning_rate=0.5), resume=True)
    # Settings not given on the command line come from the checkpoint.
    trainer = Pretrainer(
        replace(config, learning_rate=0.5), resume=True, explicit={"inputs", "output"}
    )
    assert trainer.config.learning_rate == 0.01
    result = invoke(
        *cli_args(Path(config.inputs[0]), run, max_steps=6), "--vocab-size", "7", "--resume"
    )
    assert result.exit_code == 1 and "vocab_size is 7, the run was started with 100" in (
        result.output
    )


def test_resume_may_change_where_the_run_happens(finished_run, caplog):
    """Threads, GPU and memory limit say where a run happens, not what it computes: a resume
    takes the values given, names the change in one line and records each part's values."""
    config, run = finished_run
    before = torch.get_num_threads()
    try:
        with caplog.at_level("WARNING", logger="spacy_elmo.pretrain"):
            result = invoke(
                config.inputs[0], run, "--resume", "--max-steps", "6", "--threads", "2",
                "--max-memory-gb", "64",
            )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    (line,) = [r.getMessage() for r in caplog.records if "resuming at step" in r.getMessage()]
    assert line.startswith("resuming at step 4 with threads 1 -> 2, max_memory_gb None -> 64.0")
    summary = json.loads((run / "model" / "pretrain.json").read_text())
    assert summary["steps"] == 6
    assert summary["ran_with"] == [
        {"step": 0, "threads": 1, "gpu_id": -1, "max_memory_gb": None},
        {"step": 4, "threads": 2, "gpu_id": -1, "max_memory_gb": 64.0},
    ]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["config"]["threads"] == 2


def test_resume_takes_the_gpu_given(finished_run):
    from spacy_elmo.pretrain.config import resumed_config

    config, run = finished_run
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["config"]
    moved = replace(config, gpu_id=1, threads=3, max_memory_gb=2.5, learning_rate=0.5)
    explicit = {"gpu_id", "threads", "max_memory_gb"}
    resumed, changed = resumed_config(saved, moved, run, explicit=explicit)
    assert (resumed.gpu_id, resumed.threads, resumed.max_memory_gb) == (1, 3, 2.5)
    assert changed == {"gpu_id": (-1, 1), "threads": (1, 3), "max_memory_gb": (None, 2.5)}
    assert resumed.learning_rate == 0.01  # not given: the run's own
    # Not given on the command line: the run's own values.
    kept, changed = resumed_config(saved, moved, run, explicit=set())
    assert (kept.gpu_id, kept.threads, kept.max_memory_gb) == (-1, 1, None)
    assert changed == {}


def test_cli_resume_without_settings_continues_the_run(finished_run):
    config, run = finished_run
    result = invoke(config.inputs[0], run, "--resume", "--max-steps", "6")
    assert result.exit_code == 0, result.output
    assert json.loads((run / "model" / "pretrain.json").read_text())["steps"] == 6


# ---------------------------------------------------------------------- 4. wrong numbers
def test_a_small_corpus_without_held_out_text_is_an_error(tmp_path):
    corpus = write_corpus(tmp_path / "small.txt", n=50)  # dev_every = 100
    with pytest.raises(
        ValueError,
        match=r"held-out split is empty.*50 sentences.*\(dev_every\); give held-out text \(dev\)",
    ):
        pretrain(short_config(tmp_path, corpus))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_vocabulary_that_does_not_match_the_softmax_is_an_error(finished_run):
    config, run = finished_run
    for vocab in (run / "vocab.txt", run / "model" / "vocab.txt"):
        words = vocab.read_text().splitlines()
        vocab.write_text("\n".join(words[:-1]) + "\n")
    with pytest.raises(ValueError, match="does not match the vocabulary .*vocab.txt"):
        Pretrainer(config, resume=True)
    result = CliRunner().invoke(
        app, ["perplexity", str(run / "corpus" / "dev.txt"), "--model", str(run)]
    )
    assert result.exit_code == 1 and "lm_head.safetensors does not match" in result.output


# ---------------------------------------------------------------------- 7. CLI messages
@pytest.mark.parametrize(
    "flag, setting, value",
    [
        ("--eval-every", "eval_every", "0"),
        ("--checkpoint-every", "checkpoint_every", "-5"),
        ("--threads", "threads", "0"),
        ("--lr", "learning_rate", "0"),
    ],
)
def test_bad_settings_are_messages(tmp_path, flag, setting, value):
    corpus = write_corpus(tmp_path / "corpus.txt")
    args = cli_args(corpus, tmp_path / "run")
    args[args.index(flag) + 1] = value
    result = invoke(*args)
    assert result.exit_code == 1
    assert f"error: {setting} must be " in result.output and f"got {value}" in result.output
    assert not (tmp_path / "run").exists()


def test_an_unknown_pipeline_is_a_message(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    args = [a for a in cli_args(corpus, tmp_path / "run") if a != "--pretokenized"]
    result = invoke(*args, "--pipeline", "no_such_pipeline")
    assert result.exit_code == 1 and "pipeline 'no_such_pipeline'" in result.output


def test_an_options_file_that_is_not_json_is_a_message(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    options = tmp_path / "options.json"
    options.write_text("{not json")
    result = invoke(*cli_args(corpus, tmp_path / "run"), "--options", options)
    assert result.exit_code == 1 and f"options file {options} is not valid JSON" in result.output
