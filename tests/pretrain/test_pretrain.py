"""`spacy-elmo pretrain` on a tiny corpus: learning, resume after SIGKILL, SIGINT, torchrun."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from spacy_elmo import BiLM
from spacy_elmo.pretrain import PretrainConfig, pretrain
from spacy_elmo.pretrain.corpus import iter_batches, iter_input_files
from spacy_elmo.pretrain.vocab import Vocab

SUBJECTS = ["the river", "a bank", "the investment bank", "my friend", "the water", "she"]
VERBS = ["flooded", "approved", "saw", "liked", "crossed", "bought"]
OBJECTS = ["the loan", "the bank", "a boat", "the field", "an account", "the shore"]


def write_corpus(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines = [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ." for _ in range(n)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tiny_config(tmp_path: Path, corpus: Path, **changes) -> PretrainConfig:
    values = dict(
        inputs=[str(corpus)],
        output=str(tmp_path / "run"),
        preset="tiny",
        pretokenized=True,
        vocab_size=100,
        min_count=1,
        max_steps=30,
        batch_tokens=256,
        learning_rate=1e-2,
        warmup_steps=5,
        eval_every=10,
        checkpoint_every=5,
        log_every=5,
        threads=1,
    )
    values.update(changes)
    return PretrainConfig(**values)


def short_config(tmp_path: Path, corpus: Path, **changes) -> PretrainConfig:
    """A 4-step run of `tiny_config`, checkpointed every 2 steps."""
    values = dict(max_steps=4, eval_every=4, checkpoint_every=2, log_every=2, batch_tokens=128)
    values.update(changes)
    return tiny_config(tmp_path, corpus, **values)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "spacy_elmo.cli", "pretrain", *args]


def cli_args(corpus: Path, output: Path, max_steps: int = 30) -> list[str]:
    return [
        str(corpus), str(output), "--preset", "tiny", "--pretokenized",
        "--vocab-size", "100", "--min-count", "1", "--max-steps", str(max_steps),
        "--batch-tokens", "256", "--lr", "0.01", "--warmup-steps", "5", "--eval-every", "10",
        "--checkpoint-every", "5", "--log-every", "5", "--threads", "1",
    ]  # fmt: skip


def test_pretraining_learns_and_saves_a_loadable_model(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    summary = pretrain(tiny_config(tmp_path, corpus, max_steps=60, export_allennlp=True))
    run = tmp_path / "run"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [r["dev_ppl"] for r in records if "dev_ppl" in r]
    assert len(dev) >= 6 and dev[-1] < 0.6 * dev[0]  # a 6x6x6 grammar is easy to learn
    assert dev == sorted(dev, reverse=True)
    assert summary["dev_ppl"] == pytest.approx(dev[-1], rel=1e-6)
    assert (run / "perplexity.png").stat().st_size > 1000
    assert summary["tokens_seen"] > 0 and summary["steps"] == 60
    bilm = BiLM.load(run / "model")
    exported = BiLM.from_allennlp(
        run / "allennlp" / "options.json", run / "allennlp" / "weights.hdf5"
    )
    sentence = [["the", "river", "flooded", "the", "bank", "."]]
    np.testing.assert_array_equal(bilm.embed(sentence)[0], exported.embed(sentence)[0])
    vocab = Vocab.from_file(run / "model" / "vocab.txt")
    assert vocab.words[:3] == ["<S>", "</S>", "<UNK>"] and "bank" in vocab.index
    from spacy_elmo.pretrain.evaluate import perplexity

    evaluated = perplexity(run / "model", [run / "corpus" / "dev.txt"])
    assert evaluated["ppl"] == pytest.approx(summary["dev_ppl"], rel=1e-4)


def weights_of(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


def test_resume_after_sigkill_gives_the_same_weights(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    subprocess.run(cli(*cli_args(corpus, reference)), check=True, capture_output=True)
    process = subprocess.Popen(
        cli(*cli_args(corpus, killed)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    checkpoint = killed / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if checkpoint.exists() and torch.load(checkpoint, weights_only=False)["step"] >= 10:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = torch.load(checkpoint, weights_only=False)["step"]
    assert 10 <= killed_at < 30, "the run was not killed in the middle"
    assert not (killed / "model").exists()
    subprocess.run(cli(*cli_args(corpus, killed), "--resume"), check=True, capture_output=True)
    a, b = weights_of(reference), weights_of(killed)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    metrics = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics if "train_ppl" in m]
    assert steps == sorted(set(steps))  # no duplicated log lines from the killed part


def test_sigint_writes_a_checkpoint_and_resume_finishes(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "run"
    process = subprocess.Popen(
        cli(*cli_args(corpus, run, max_steps=100000)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "checkpoints" / "last.pt").exists():
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "--resume" in output
    step = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["step"]
    assert step >= 5
    result = subprocess.run(
        cli(*cli_args(corpus, run, max_steps=step + 5), "--resume"), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((run / "model" / "pretrain.json").read_text())["steps"] == step + 5


def test_torchrun_two_ranks_hold_identical_weights(tmp_path):
    """Two gloo ranks, with a held-out evaluation (inference) between training steps."""
    corpus = write_corpus(tmp_path / "corpus.txt")
    dev = write_corpus(tmp_path / "dev.txt", seed=3)
    run = tmp_path / "ddp"
    args = cli_args(corpus, run, max_steps=8)
    args[args.index("--eval-every") + 1] = "4"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(29500 + os.getpid() % 1000),
         "-m", "spacy_elmo.cli", "pretrain", *args, "--dev", str(dev)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Grad strides do not match" not in result.stderr
    summary = json.loads((run / "model" / "pretrain.json").read_text())
    assert summary["world_size"] == 2
    first, second = summary["rank_checksums"]
    assert first == second
    # Rank 0 reads the even batches of the stream and counts its tokens once per rank.
    stream = iter_batches(run / "corpus" / "train.txt", 0, 256)
    batches = [next(stream)[1] for _ in range(16)]
    rank0 = sum(len(s) for batch in batches[0::2] for s in batch)
    assert summary["tokens_seen"] == 2 * rank0


def test_init_from_adapts_a_saved_model(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    pretrain(tiny_config(tmp_path, corpus, max_steps=10))
    before = weights_of(tmp_path / "run")
    adapted = tiny_config(
        tmp_path, write_corpus(tmp_path / "domain.txt", seed=1), max_steps=5,
        output=str(tmp_path / "adapted"), init_from=str(tmp_path / "run" / "model"),
    )  # fmt: skip
    pretrain(adapted)
    after = weights_of(tmp_path / "adapted")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # Starting point really was the saved model: small steps, so weights stay close.
    key = "forward_lstm.layers.0.input_weight"
    assert (before[key] - after[key]).abs().max() < 0.2


def test_init_from_allennlp_files(tmp_path, allennlp_fixture):
    corpus = write_corpus(tmp_path / "corpus.txt")
    summary = pretrain(tiny_config(tmp_path, corpus, max_steps=3, init_from=str(allennlp_fixture)))
    assert summary["options"]["lstm"]["dim"] == 64  # the fixture's architecture, not "tiny"


def test_empty_and_binary_files_are_skipped_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "texts"
    folder.mkdir()
    write_corpus(folder / "good.txt")
    (folder / "empty.txt").write_text("")
    (folder / "binary.bin").write_bytes(b"\x00\x01\x02garbage" * 100)
    with caplog.at_level("WARNING", logger="spacy_elmo.pretrain"):
        files = iter_input_files([folder])
    assert files == [folder / "good.txt"]
    assert "empty.txt: empty file" in caplog.text and "binary.bin: binary file" in caplog.text


def test_corpus_without_sentences_is_a_clear_error(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\n")
    with pytest.raises(ValueError, match="has no sentences: .*blank.txt"):
        pretrain(tiny_config(tmp_path, blank))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pretrain(tiny_config(tmp_path, tmp_path / "missing.txt"))


def test_raw_text_is_sentence_split_with_spacy(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("The river flooded. It rained a lot!\nDon't panic.\n" * 50)
    pretrain(tiny_config(tmp_path, raw, pretokenized=False, max_steps=2, dev_every=10))
    lines = (tmp_path / "run" / "corpus" / "train.txt").read_text().splitlines()
    assert "The river flooded ." in lines and "Do n't panic ." in lines
    assert (tmp_path / "run" / "corpus" / "dev.txt").read_text().strip()


def test_language_model_targets_are_next_and_previous_words():
    """The summed NLL equals -log p(next word) forward and -log p(previous word) backward."""
    from spacy_elmo.bilm import BiLMOptions, batch_to_ids
    from spacy_elmo.bilm.lm_head import LMHead
    from spacy_elmo.pretrain.objective import LanguageModel, target_tensor
    from spacy_elmo.pretrain.presets import preset

    torch.manual_seed(0)
    words = ["the", "river", "bank", "flooded", "."]
    vocab = Vocab(["<S>", "</S>", "<UNK>", *words])
    bilm = BiLM(BiLMOptions.from_dict(preset("tiny")))
    for cutoffs in ((), (4,)):  # full softmax and adaptive softmax
        model = LanguageModel(bilm, LMHead(16, len(vocab), cutoffs), dropout=0.0).eval()
        sentences = [["the", "river", "flooded"], ["bank", "unknownword"]]
        with torch.no_grad():
            sums = model(batch_to_ids(sentences), target_tensor(sentences, vocab))
            acts = bilm.activations(batch_to_ids(sentences))
            head = model.head.softmax
            forward_nll = backward_nll = 0.0
            for row, sentence in enumerate(sentences):
                ids = [vocab.bos, *vocab.ids(sentence), vocab.eos]
                for t in range(len(ids) - 1):
                    hidden = acts.forward[-1][row, t][None]
                    log_p = head.log_prob(hidden) if cutoffs else head(hidden).log_softmax(-1)
                    forward_nll -= log_p[0, ids[t + 1]].item()
                for t in range(1, len(ids)):
                    hidden = acts.backward[-1][row, t][None]
                    log_p = head.log_prob(hidden) if cutoffs else head(hidden).log_softmax(-1)
                    backward_nll -= log_p[0, ids[t - 1]].item()
        assert sums[1].item() == sums[3].item() == 4 + 3  # n + 1 targets per sentence
        assert sums[0].item() == pytest.approx(forward_nll, rel=1e-5)
        assert sums[2].item() == pytest.approx(backward_nll, rel=1e-5)
        assert vocab.ids(["unknownword"]) == [vocab.unk]


def test_torchrun_with_an_adaptive_softmax(tmp_path):
    """A vocabulary past the first cutoff (2,000) makes the softmax adaptive; batches that
    have no target in a tail cluster leave its weights unused on one rank only."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    corpus = tmp_path / "corpus.txt"
    lines = [" ".join(rng.choices(words[:50], k=3) + [rng.choice(words)]) for _ in range(5000)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = tmp_path / "ddp"
    args = cli_args(corpus, run, max_steps=6)
    args[args.index("--vocab-size") + 1] = "4000"
    args[args.index("--batch-tokens") + 1] = "48"  # a few sentences: tails often unused
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(29600 + os.getpid() % 1000),
         "-m", "spacy_elmo.cli", "pretrain", *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "model" / "pretrain.json").read_text())
    assert summary["vocab_size"] > 2000
    first, second = summary["rank_checksums"]
    assert first == second
