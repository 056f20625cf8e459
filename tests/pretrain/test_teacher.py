"""A transformer teacher in pretraining (`spacy_elmo.pretrain.teacher`, `teacher_store`): word
piece alignment, the on-disk store and its resume, and the loss it adds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain import teacher_store as store_module
from spacy_elmo.pretrain.teacher import Teacher
from spacy_elmo.pretrain.teacher_store import TeacherStore, build_store, sentence_key

from .test_pretrain import OBJECTS, SUBJECTS, VERBS, cli, cli_args, tiny_config, write_corpus

transformers = pytest.importorskip("transformers")

MAX_POSITIONS = 12  # the teacher's length limit: [CLS] + 10 pieces + [SEP]
PIECES = ["un", "##believ", "##able", "##s"]


def make_teacher(folder: Path, seed: int = 0) -> Path:
    """A two-layer BERT with random weights and a WordPiece vocabulary of the toy corpus."""
    words = sorted({w for phrase in SUBJECTS + VERBS + OBJECTS for w in phrase.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words, *PIECES]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=MAX_POSITIONS,
    )
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory) -> Path:
    return make_teacher(tmp_path_factory.mktemp("teacher"))


def _hidden(teacher: Teacher, pieces: list[str], layer: int) -> np.ndarray:
    ids = teacher.tokenizer.convert_tokens_to_ids(["[CLS]", *pieces, "[SEP]"])
    with torch.no_grad():
        out = teacher.model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[layer][0].numpy()


def test_a_word_of_many_pieces_gets_the_mean_of_their_vectors(teacher_folder):
    teacher = Teacher.load(teacher_folder, layer=1)
    vectors, counts = teacher.word_vectors([["the", "unbelievables", "bank"]])
    hidden = _hidden(teacher, ["the", *PIECES, "bank"], layer=1)  # [CLS] at 0
    np.testing.assert_allclose(vectors[0][0], hidden[1], atol=1e-6)
    np.testing.assert_allclose(vectors[0][1], hidden[2:6].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(vectors[0][2], hidden[6], atol=1e-6)
    assert (counts.words, counts.empty, counts.cut) == (3, 0, 0)


def test_words_past_the_length_limit_get_no_target_and_are_counted(teacher_folder):
    teacher = Teacher.load(teacher_folder)
    # 10 pieces fit: 8 one-piece words, then "unbelievables" (4 pieces) is cut after 2.
    words = ["the"] * 8 + ["unbelievables", "bank", "."]
    vectors, counts = teacher.word_vectors([words, ["the", "bank"]])
    kept = ~np.isnan(vectors[0][:, 0])
    assert kept.tolist() == [True] * 8 + [False] * 3
    assert (counts.words, counts.cut, counts.empty) == (8 + 2, 3, 0)
    hidden = _hidden(teacher, ["the"] * 8 + PIECES[:2], layer=-1)
    np.testing.assert_allclose(vectors[0][:8], hidden[1:9], atol=1e-6)


def test_a_word_without_pieces_and_an_empty_sentence_get_no_target(teacher_folder):
    teacher = Teacher.load(teacher_folder)
    vectors, counts = teacher.word_vectors([["the", "\u200b", "bank"], []])
    assert np.isnan(vectors[0][1]).all() and not np.isnan(vectors[0][[0, 2]]).any()
    assert vectors[1].shape == (0, 16)
    assert (counts.words, counts.empty, counts.cut) == (2, 1, 0)


def test_an_unknown_layer_is_a_clear_error(teacher_folder):
    with pytest.raises(ValueError, match="teacher_layer 3: .* hidden states 0 .. 2"):
        Teacher.load(teacher_folder, layer=3)


def _corpus_with_repeats_and_empty_lines(path: Path) -> Path:
    lines = write_corpus(path, n=60).read_text().splitlines()
    lines = lines + ["", lines[0], "the unbelievables bank ."] + lines[:5]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_store_holds_each_distinct_sentence_once(tmp_path, teacher_folder):
    corpus = _corpus_with_repeats_and_empty_lines(tmp_path / "corpus.txt")
    teacher = Teacher.load(teacher_folder)
    record = build_store(tmp_path / "store", corpus, teacher)
    sentences = [line.split(" ") for line in corpus.read_text().splitlines() if line]
    distinct = {" ".join(s): s for s in sentences}
    assert record["sentences"] == len(distinct)
    assert record["words"] == sum(len(s) for s in distinct.values())
    assert record["counts"]["words"] == record["words"]
    assert (tmp_path / "store" / "vectors.f16").stat().st_size == record["words"] * 16 * 2
    store = TeacherStore(tmp_path / "store")
    expected, _ = teacher.word_vectors(list(distinct.values()))
    for sentence, vectors in zip(distinct.values(), expected):
        np.testing.assert_array_equal(store.vectors(sentence), vectors.astype(np.float16))
    # Targets: standardised with the store's statistics, NaN at <S>, </S> and padding.
    short = ["the", "unbelievables", "bank", "."]
    long = max(sentences, key=len)
    batch = [long, short]
    targets = store.targets(batch).numpy()
    assert targets.shape == (2, len(long) + 2, 16) and len(long) > len(short)
    stored = np.asarray(store.vectors(short), np.float32)
    mean, std = np.array(record["mean"]), np.array(record["std"])
    np.testing.assert_allclose(targets[1, 1:5], (stored - mean) / std, rtol=1e-5, atol=1e-5)
    assert np.isnan(targets[1, [0, 5]]).all() and np.isnan(targets[0, 0]).all()
    assert np.isnan(targets[1, 6:]).all()  # padding
    all_rows = np.concatenate([v for v in expected]).astype(np.float64)
    np.testing.assert_allclose(mean, all_rows.mean(axis=0), atol=1e-4)
    with pytest.raises(KeyError, match="no vectors for: a sentence the store never saw"):
        store.targets([["a", "sentence", "the", "store", "never", "saw"]])


def test_a_killed_build_resumes_to_the_same_files(tmp_path, teacher_folder, monkeypatch):
    corpus = _corpus_with_repeats_and_empty_lines(tmp_path / "corpus.txt")
    teacher = Teacher.load(teacher_folder)
    build_store(tmp_path / "reference", corpus, teacher)
    monkeypatch.setattr(store_module, "FLUSH_SENTENCES", 7)
    flushes = []

    def killed_after_three_flushes(message: str) -> None:
        flushes.append(message)
        if "sentences" in message and " of " in message and len(flushes) > 3:
            raise KeyboardInterrupt

    killed = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        build_store(killed, corpus, teacher, report=killed_after_three_flushes)
    progress = json.loads((killed / "progress.json").read_text())
    assert 0 < progress["lines"] < len(corpus.read_text().splitlines())
    with (killed / "vectors.f16").open("ab") as handle:  # a half-written row of a killed write
        handle.write(b"\x01\x02\x03")
    messages: list[str] = []
    build_store(killed, corpus, teacher, report=messages.append)
    assert any("resuming after line" in m for m in messages)
    index = "index.bin"
    assert (killed / index).read_bytes() == (tmp_path / "reference" / index).read_bytes()
    # The teacher batches the sentences of each flush by length, so a vector can differ from the
    # uninterrupted build's in float32 noise: at most one float16 step after rounding.
    resumed, reference = (
        np.fromfile(d / "vectors.f16", "<f2") for d in (killed, tmp_path / "reference")
    )
    assert resumed.shape == reference.shape
    np.testing.assert_allclose(resumed, reference, rtol=2**-10, atol=2**-24)
    a = json.loads((killed / "store.json").read_text())
    b = json.loads((tmp_path / "reference" / "store.json").read_text())
    for name in ("mean", "std"):
        np.testing.assert_allclose(a.pop(name), b.pop(name), rtol=1e-4, atol=1e-6)
    assert a == b
    rows = resumed.reshape(-1, 16).astype(np.float64)
    rows = rows[~np.isnan(rows[:, 0])]
    np.testing.assert_allclose(
        json.loads((killed / "store.json").read_text())["mean"],
        rows.mean(axis=0),
        rtol=1e-12,
        atol=1e-12,
    )


def test_a_store_of_another_corpus_or_teacher_is_refused(tmp_path, teacher_folder):
    corpus = write_corpus(tmp_path / "corpus.txt", n=30)
    build_store(tmp_path / "store", corpus, Teacher.load(teacher_folder))
    other_corpus = write_corpus(tmp_path / "other.txt", n=30, seed=5)
    with pytest.raises(ValueError, match="made from another corpus"):
        build_store(tmp_path / "store", other_corpus, Teacher.load(teacher_folder))
    with pytest.raises(ValueError, match="made from another teacher"):
        build_store(tmp_path / "store", corpus, Teacher.load(teacher_folder, layer=1))


def test_a_store_over_the_size_limit_is_refused_before_the_teacher_runs(tmp_path, teacher_folder):
    corpus = write_corpus(tmp_path / "corpus.txt", n=30)
    with pytest.raises(ValueError, match=r"needs 0\.0 GiB .* over the limit of 1e-06 GiB"):
        build_store(tmp_path / "store", corpus, Teacher.load(teacher_folder), max_gb=1e-6)
    assert not (tmp_path / "store" / "vectors.f16").exists()


def test_sentence_keys_are_those_of_the_corpus_lines():
    assert sentence_key(["a", "b"]) == sentence_key("a b".split(" "))
    assert sentence_key(["a", "b"]) != sentence_key(["ab"])


def test_pretraining_with_a_teacher_lowers_its_loss_and_saves_the_plain_biLM(
    tmp_path, teacher_folder
):
    corpus = write_corpus(tmp_path / "corpus.txt")
    config = tiny_config(tmp_path, corpus, teacher=str(teacher_folder), max_steps=60, log_every=10)
    summary = pretrain(config)
    assert summary["steps"] == 60
    records = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if "teacher_cosine" in line
    ]
    assert len(records) == 6
    assert records[-1]["teacher_cosine"] < records[0]["teacher_cosine"] - 0.1
    assert (tmp_path / "run" / "teacher" / "store.json").exists()
    plain = tiny_config(tmp_path, corpus, output=str(tmp_path / "plain"), max_steps=2)
    pretrain(plain)
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    reference = load_file(str(tmp_path / "plain" / "model" / "model.safetensors"))
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in reference.items()}


def test_resume_with_a_teacher_gives_the_same_weights(tmp_path, teacher_folder, monkeypatch):
    from spacy_elmo.pretrain.trainer import Pretrainer

    corpus = write_corpus(tmp_path / "corpus.txt")

    def config(output: str):
        return tiny_config(tmp_path, corpus, teacher=str(teacher_folder), output=output)

    pretrain(config(str(tmp_path / "reference")))

    # Stopped after step 12 as a signal stops it: a checkpoint, then resumed to the end.
    def stop_after_step_12(self) -> bool:
        self.stop_requested = self.step >= 12
        return self.stop_requested

    monkeypatch.setattr(Pretrainer, "_should_stop", stop_after_step_12)
    interrupted = pretrain(config(str(tmp_path / "two")))
    assert interrupted == {"interrupted": True, "step": 12, "signal": None}
    monkeypatch.undo()
    pretrain(config(str(tmp_path / "two")), resume=True, explicit=set())
    a = load_file(str(tmp_path / "reference" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_with_another_teacher_is_refused(tmp_path, teacher_folder):
    corpus = write_corpus(tmp_path / "corpus.txt")
    pretrain(tiny_config(tmp_path, corpus, teacher=str(teacher_folder), max_steps=5))
    other = make_teacher(tmp_path / "other_teacher", seed=1)
    config = tiny_config(tmp_path, corpus, teacher=str(other), max_steps=10)
    with pytest.raises(ValueError, match="teacher is .* the run was started with"):
        pretrain(config, resume=True, explicit={"max_steps", "teacher"})


@pytest.mark.slow
def test_torchrun_with_a_teacher_holds_identical_weights(tmp_path, teacher_folder):
    corpus = write_corpus(tmp_path / "corpus.txt")
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(29600 + os.getpid() % 1000),
         *cli(*cli_args(corpus, run, max_steps=6), "--teacher", str(teacher_folder))[1:]],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run / "model" / "pretrain.json").read_text())
    assert summary["world_size"] == 2
    first, second = summary["rank_checksums"]
    assert first == second
