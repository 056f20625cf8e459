"""A training step that meets a NaN or infinity stops with an error naming the step and value,
before the value reaches the weights: pretraining keeps its last checkpoint, writes no model and
resumes from that checkpoint; the elmo component's fine-tuning leaves the biLM as it was."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import spacy
import torch
from spacy.training import Example
from spacy.util import load_model_from_config
from thinc.api import Adam
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.bilm import BiLMOptions, batch_to_ids
from spacy_elmo.cli import app
from spacy_elmo.layers.bilm_wrapper import BiLMShim, NonFiniteUpdate
from spacy_elmo.layers.elmo_model import get_bilm
from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain.checkpoint import load_checkpoint
from spacy_elmo.pretrain.divergence import DIVERGED, TrainingDiverged
from spacy_elmo.pretrain.objective import MAX_LOG_FLOAT, LanguageModel, perplexity_of

from ..bilm.util import tiny_options
from ..pipeline.pipeline_util import synthetic_docs, tiny_training_config, write_train_dev
from .test_pretrain import cli, cli_args, tiny_config, weights_of, write_corpus


def checkpoint_step(run: Path) -> int:
    return load_checkpoint(run / "checkpoints" / "last.pt")["step"]  # also: every weight finite


@pytest.mark.parametrize(
    "changes, checkpointed",
    [
        # Adam moves every weight by about the learning rate: 1e29 at the first step (warm-up
        # 1/10), NaN in the second forward pass, before the first checkpoint (step 5).
        ({"learning_rate": 1e30}, False),
        # A rate warming up over 20 steps blows the weights up over a few steps, until the loss
        # passes 709 nats a token (a perplexity past the largest float) near step 6; the
        # checkpoints before hold the last finite weights.
        ({"learning_rate": 100.0, "warmup_steps": 20, "checkpoint_every": 2}, True),
    ],
    ids=["before-a-checkpoint", "after-a-checkpoint"],
)
def test_a_diverging_run_stops_at_the_step_and_keeps_the_last_finite_checkpoint(
    tmp_path, changes, checkpointed
):
    corpus = write_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as caught:
        pretrain(tiny_config(tmp_path, corpus, **changes))
    message = str(caught.value)
    record = json.loads((run / DIVERGED).read_text())
    found = re.search(r"training diverged at step (\d+): the loss is (\S+) ", message)
    assert found and int(found[1]) == record["step"], message
    loss = float(found[2])
    assert not math.isfinite(loss) or loss > MAX_LOG_FLOAT
    assert "no model was written" in message
    assert not (run / "model").exists()
    kept = record["checkpoint_step"]
    if not checkpointed:
        assert kept is None and not (run / "checkpoints" / "last.pt").exists()
        assert "no checkpoint was written before it" in message
    else:
        assert kept is not None and kept < record["step"] <= kept + 2
        assert checkpoint_step(run) == kept  # loads: every weight in it is finite
        assert f"the checkpoint of step {kept}" in message and "resume" in message


def test_the_command_exits_with_the_error_and_writes_no_model(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    args = cli_args(corpus, run)
    args[args.index("--lr") + 1] = "1e30"
    result = subprocess.run(cli(*args), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "training diverged at step 2: the loss is nan" in errors[0]
    assert "Traceback" not in result.stderr and "perplexity" not in result.stdout
    assert not (run / "model").exists()


class FaultAt:
    """A NaN in the language model's loss at one training step (a transient fault: an
    overflow, a bad batch), injected by a forward hook; evaluation passes are not counted."""

    def __init__(self, step: int) -> None:
        self.step, self.calls = step, 0

    def __enter__(self) -> FaultAt:
        self.handle = torch.nn.modules.module.register_module_forward_hook(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()

    def hook(self, module, args, output):
        if isinstance(module, LanguageModel) and module.training:
            self.calls += 1
            if self.calls == self.step:
                return output * float("nan")
        return None


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    """A clean 30-step run (checkpoints every 5 steps), and the same run stopped by a NaN at
    step 8: (corpus, clean run, faulted run)."""
    tmp = tmp_path_factory.mktemp("fault")
    corpus = write_corpus(tmp / "corpus.txt")
    clean = tiny_config(tmp, corpus, output=str(tmp / "clean"))
    pretrain(clean)
    with FaultAt(8), pytest.raises(TrainingDiverged, match="at step 8: the loss is nan"):
        pretrain(tiny_config(tmp, corpus, output=str(tmp / "faulted")))
    return corpus, tmp / "clean", tmp / "faulted"


def test_resuming_after_a_transient_fault_gives_the_uninterrupted_weights(faulted, tmp_path):
    corpus, clean, faulted_run = faulted
    run = tmp_path / "run"
    shutil.copytree(faulted_run, run)
    assert checkpoint_step(run) == 5 and not (run / "model").exists()
    pretrain(tiny_config(tmp_path, corpus), resume=True)
    want, got = weights_of(clean), weights_of(run)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    assert not (run / DIVERGED).exists()  # the next checkpoint holds the run's settings


def test_after_a_divergence_a_resumed_run_may_lower_its_learning_rate(faulted, tmp_path):
    corpus, _, faulted_run = faulted
    run = tmp_path / "run"
    shutil.copytree(faulted_run, run)
    # The command line: the settings given are the run's own, but for the two remedies.
    args = cli_args(corpus, run)
    args[args.index("--lr") + 1] = "1e-3"
    result = CliRunner().invoke(app, ["pretrain", *args, "--clip-norm", "1.0", "--resume"])
    assert result.exit_code == 0, result.output
    assert json.loads((run / "model" / "pretrain.json").read_text())["steps"] == 30
    saved = load_checkpoint(run / "checkpoints" / "last.pt")
    assert (saved["config"]["learning_rate"], saved["config"]["clip_norm"]) == (1e-3, 1.0)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["lr"] for r in records if "lr" in r}
    # The schedule of tiny_config (warm-up 5, linear decay to 10% at step 30) times the new rate.
    for step, rate in rates.items():
        factor = 1.0 - 0.9 * (step - 5) / 25
        want = (1e-2 if step <= 5 else 1e-3) * factor
        assert rate == pytest.approx(want, rel=1e-6), step
    # Without a divergence the learning rate is a setting that a resumed run keeps.
    with pytest.raises(ValueError, match="learning_rate is 0.0001, the run was started with"):
        pretrain(tiny_config(tmp_path, corpus, learning_rate=1e-4, max_steps=40), resume=True)


@pytest.mark.slow
def test_every_rank_stops_at_the_same_step_under_torchrun(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    args = cli_args(corpus, tmp_path / "ddp")
    args[args.index("--lr") + 1] = "1e30"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(29600 + os.getpid() % 1000),
         "-m", "spacy_elmo.cli", "pretrain", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error: training diverged" in line]
    assert len(errors) == 2 and all("at step 2" in line for line in errors), result.stderr[-3000:]
    assert not (tmp_path / "ddp" / "model").exists()


# ------------------------------------------------------------------ the elmo component
def tiny_shim() -> tuple[BiLMShim, BiLM]:
    torch.manual_seed(0)
    bilm = BiLM(BiLMOptions.from_dict(tiny_options()))
    return BiLMShim(bilm), bilm


@pytest.mark.parametrize(
    "gradient_scale, learn_rate, what",
    [
        (float("nan"), 0.01, "the gradient of"),
        (float("inf"), 0.01, "the gradient of"),
        # Finite gradients, but Adam's first step moves each weight by about the learning rate:
        # 1e39 is past float32's largest value.
        (1.0, 1e39, "the updated weight of"),
    ],
    ids=["nan-gradient", "inf-gradient", "overflowing-step"],
)
def test_a_fine_tuning_step_that_is_not_finite_leaves_the_bilm_as_it_was(
    gradient_scale, learn_rate, what
):
    shim, bilm = tiny_shim()
    before = {name: weight.detach().clone() for name, weight in bilm.named_parameters()}
    char_ids = batch_to_ids([["the", "river", "bank"], ["a", "bank"]])
    (shim._model(char_ids).layers.sum() * gradient_scale).backward()
    with pytest.raises(NonFiniteUpdate, match=f"{what} '.*' holds (nan|inf|-inf)"):
        shim.finish_update(Adam(learn_rate, grad_clip=1.0))
    for name, weight in bilm.named_parameters():
        assert torch.equal(weight, before[name]), name
        assert not weight.grad.any(), name  # the gradients are cleared as after a step
    # A sound step afterwards updates the weights as usual.
    (shim._model(char_ids).layers.sum()).backward()
    shim.finish_update(Adam(0.01, grad_clip=1.0))
    assert any(not torch.equal(w, before[n]) for n, w in bilm.named_parameters())
    assert all(torch.isfinite(w).all() for w in bilm.parameters())


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_fine_tuning_in_a_pipeline_stops_before_the_bilm_turns_nan(bilm_dir, tmp_path):
    """The gradient that reaches the biLM is not finite (a `grad_factor` of infinity, set on
    the model as a config cannot hold it) while the components downstream train as usual."""
    config = tiny_training_config(bilm_dir, *write_train_dev(tmp_path, 20, 5))
    config["components"]["elmo"]["model"].update(frozen=False)
    nlp = load_model_from_config(config, auto_fill=True)
    gold = synthetic_docs(nlp, 10, seed=2)
    examples = [Example(spacy.tokens.Doc(nlp.vocab, words=[t.text for t in d]), d) for d in gold]
    for eg in examples:
        eg.predicted[0].is_sent_start = True
    nlp.initialize(lambda: examples)
    for node in nlp.get_pipe("elmo").model.walk():
        if "settings" in node.attrs:
            node.attrs["settings"] = replace(node.attrs["settings"], grad_factor=float("inf"))
    bilm = get_bilm(nlp.get_pipe("elmo").model)
    before = {name: weight.detach().clone() for name, weight in bilm.named_parameters()}
    optimizer = nlp.create_optimizer()
    with pytest.raises(NonFiniteUpdate, match="fine-tuning the elmo biLM: the gradient of"):
        for _ in range(3):  # the upstream's update lags one step behind (spaCy's order)
            nlp.update(examples, sgd=optimizer)
    for name, weight in bilm.named_parameters():
        assert torch.equal(weight, before[name]), name


@pytest.mark.parametrize(
    "nll_sum, count, want",
    [(20.0, 10.0, math.exp(2.0)), (7100.0, 10.0, math.inf), (math.nan, 10.0, math.nan)],
    ids=["finite", "overflowing", "nan"],
)
def test_a_perplexity_past_the_largest_float_is_infinite_not_an_error(nll_sum, count, want):
    got = perplexity_of(nll_sum, count)
    assert got == pytest.approx(want, rel=1e-12, nan_ok=True)
