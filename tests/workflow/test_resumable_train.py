"""workflow.resumable_train: a run stopped after a checkpoint and resumed ends with the same
model files, byte for byte, as `spacy train` and as an uninterrupted resumable run (a tiny
tok2vec + tagger + NER, the tagger with a torch layer as the transformer pipeline has)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import thinc
import torch
from spacy.cli.init_config import fill_config
from spacy.cli.train import train as spacy_train
from spacy.ml.models.tok2vec import tok2vec_listener_v1
from spacy.tokens import Doc, DocBin
from spacy.util import registry
from spacy.vocab import Vocab
from thinc.api import PyTorchWrapper, chain, with_array

from workflow import resumable_train

# a small tok2vec shared by a tagger and NER: small enough to train 9 steps in a second or two
CONFIG = """
[paths]
train = null
dev = null

[system]
seed = 0
gpu_allocator = null

[nlp]
lang = "en"
pipeline = ["tok2vec","tagger","ner"]
batch_size = 8

[components]

[components.tok2vec]
factory = "tok2vec"

[components.tok2vec.model]
@architectures = "spacy.Tok2Vec.v2"

[components.tok2vec.model.embed]
@architectures = "spacy.MultiHashEmbed.v2"
width = 16
attrs = ["NORM","PREFIX","SUFFIX","SHAPE"]
rows = [500,200,200,100]
include_static_vectors = false

[components.tok2vec.model.encode]
@architectures = "spacy.MaxoutWindowEncoder.v2"
width = 16
depth = 1
window_size = 1
maxout_pieces = 2

[components.tagger]
factory = "tagger"

[components.tagger.model]
@architectures = "spacy.Tagger.v2"
nO = null

[components.tagger.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = 16

[components.ner]
factory = "ner"

[components.ner.model]
@architectures = "spacy.TransitionBasedParser.v2"
state_type = "ner"
hidden_width = 16
maxout_pieces = 2
use_upper = true

[components.ner.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = 16

[corpora]

[corpora.train]
@readers = "spacy.Corpus.v1"
path = ${paths.train}

[corpora.dev]
@readers = "spacy.Corpus.v1"
path = ${paths.dev}

[training]
seed = ${system.seed}
dropout = 0.1
max_steps = 9
eval_frequency = 3
patience = 0
max_epochs = 0
train_corpus = "corpora.train"
dev_corpus = "corpora.dev"

[training.batcher]
@batchers = "spacy.batch_by_words.v1"
size = 12
tolerance = 0.2

[training.optimizer]
@optimizers = "Adam.v1"
learn_rate = 0.01

[initialize]
"""

# the tagger's variant with a torch layer (a thinc shim, as the transformer's): parameters and
# Adam moments of torch modules are checkpointed apart from thinc's own
TORCH_TAGGER = """
[components.tagger.model.tok2vec]
@architectures = "test_resumable.TorchHead.v1"
width = 16
"""
LISTENER_TAGGER = """
[components.tagger.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = 16
"""


@registry.architectures("test_resumable.TorchHead.v1")
def torch_head(width: int):
    """The shared tok2vec's output through a torch Linear layer."""
    return chain(
        tok2vec_listener_v1(width), with_array(PyTorchWrapper(torch.nn.Linear(width, width)))
    )


WORDS = (("Peter", "NNP", "B-PER"), ("visited", "VBD", "O"), ("Acme", "NNP", "B-ORG"))


def corpus(path: Path, n: int, offset: int) -> Path:
    """``n`` short annotated sentences, each different (so that the data order matters)."""
    vocab = Vocab()
    docs = []
    for i in range(offset, offset + n):
        words = [w for w, _, _ in WORDS] + [f"w{i}", "."]
        tags = [t for _, t, _ in WORDS] + ["NN", "."]
        ents = [e for _, _, e in WORDS] + ["O", "O"]
        docs.append(Doc(vocab, words=words, tags=tags, ents=ents))
    DocBin(docs=docs).to_disk(path)
    return path


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Path, list[str]]:
    """The tiny config (the tagger with a torch layer on the shared tok2vec) and its corpora."""
    partial, config = tmp_path / "partial.cfg", tmp_path / "config.cfg"
    text = CONFIG.replace(LISTENER_TAGGER, TORCH_TAGGER)
    assert "TorchHead" in text
    partial.write_text(text)
    fill_config(config, partial, silent=True)  # spaCy's defaults for the rest
    train = corpus(tmp_path / "train.spacy", 10, 0)  # ~3 steps an epoch: resume across epochs
    dev = corpus(tmp_path / "dev.spacy", 4, 100)
    return config, ["--paths.train", str(train), "--paths.dev", str(dev)]


def model_files(output: Path) -> dict[str, bytes]:
    """The weights and annotations of model-last (meta.json holds timings, so it is left out)."""
    last = output / "model-last"
    return {
        str(path.relative_to(last)): path.read_bytes()
        for path in sorted(last.rglob("*"))
        if path.is_file() and path.name != "meta.json"
    }


def test_stopped_and_resumed_run_equals_an_uninterrupted_one(setup, tmp_path, monkeypatch):
    config, overrides = setup
    # spaCy's own loop
    reference = tmp_path / "spacy"
    keys = (key.removeprefix("--") for key in overrides[::2])
    spacy_train(config, reference, overrides=dict(zip(keys, overrides[1::2])))
    # resumable, uninterrupted
    whole = tmp_path / "whole"
    assert resumable_train.main([str(config), "--output", str(whole), *overrides]) == 0
    assert not (whole / "checkpoint").exists()
    # resumable, stopped after the checkpoints of steps 3 and 6, resumed each time
    stopped = tmp_path / "stopped"
    for stop in ("3", "6"):
        monkeypatch.setenv("RESUMABLE_STOP_AT_STEP", stop)
        with pytest.raises(SystemExit, match=f"step {stop}"):
            resumable_train.main([str(config), "--output", str(stopped), *overrides])
        assert (stopped / "checkpoint" / "state.json").exists()
        shims = torch.load(stopped / "checkpoint" / "shims.pt", weights_only=False)
        assert [key.split("/")[0] for key in shims] == ["tagger"]  # the torch Linear
    monkeypatch.delenv("RESUMABLE_STOP_AT_STEP")
    assert resumable_train.main([str(config), "--output", str(stopped), *overrides]) == 0

    expected = model_files(reference)
    assert expected  # weights of tok2vec, tagger and ner
    assert model_files(whole) == expected
    assert model_files(stopped) == expected
    meta = json.loads((stopped / "model-best" / "meta.json").read_text())
    reference_meta = json.loads((reference / "model-best" / "meta.json").read_text())
    assert meta["performance"] == reference_meta["performance"]
    timeline = json.loads((stopped / "timeline.json").read_text())
    assert [segment[0] for segment in timeline["segments"]] == [0, 4, 7]
    assert [step for step, _ in timeline["evaluations"]] == [0, 3, 6, 9]
    assert timeline["last_step"] == 9
    assert not (stopped / "checkpoint").exists()


def test_arguments_are_checked(tmp_path: Path):
    with pytest.raises(SystemExit, match="--output is required"):
        resumable_train.main([str(tmp_path / "config.cfg")])
    with pytest.raises(SystemExit, match="--gpu-id 'x' is not a number"):
        resumable_train.main(["config.cfg", "--output", str(tmp_path), "--gpu-id", "x"])
    assert resumable_train.parse_args(
        ["c.cfg", "-o", "out", "-g", "0", "--training.max_steps", "5"]
    ) == (Path("c.cfg"), Path("out"), 0, ["--training.max_steps", "5"])


@pytest.mark.slow
def test_an_evidence_run_stopped_midway_resumes_and_records_one_loop(setup, tmp_path, monkeypatch):
    """workflow.evidence.runs.run_one of a resumable pipeline: stopped after step 3's checkpoint,
    started again, it ends as `spacy train` would have, and run.json lists both starts."""
    from workflow.evidence import runs

    _, overrides = setup
    # run_one trains in a child process, which cannot see this module's TorchHead: the plain
    # listener tagger (the torch shim's checkpoint is covered in-process above)
    partial, config = tmp_path / "plain_partial.cfg", tmp_path / "plain.cfg"
    partial.write_text(CONFIG)
    fill_config(config, partial, silent=True)
    monkeypatch.setitem(
        runs.PIPELINES, "tiny", runs.Pipeline(config, static_vectors=False, resumable=True)
    )
    train = Path(overrides[1])
    spec = runs.make_spec(
        "tiny", "all", 0, root=tmp_path / "runs", train=train, dev=Path(overrides[3]),
        test=Path(overrides[3]), max_steps=9, eval_frequency=3, patience=0,
    )  # fmt: skip
    assert spec.train_command()[1:3] == ["-m", "workflow.resumable_train"]
    monkeypatch.setenv("RESUMABLE_STOP_AT_STEP", "3")
    with pytest.raises(runs.RunError, match="stopping after the checkpoint of step 3"):
        runs.run_one(spec)
    assert not (spec.directory / "run.json").exists()
    monkeypatch.delenv("RESUMABLE_STOP_AT_STEP")
    record = runs.run_one(spec)
    assert [segment[0] for segment in record["segments"]] == [0, 4]
    assert [e["step"] for e in record["evaluations"]] == [0, 3, 6, 9]
    assert record["steps"] == 9 and record["train_sentences"] == 10
    assert record["command"]["train"].startswith("python -m workflow.resumable_train ")
    assert record["environment"]["packages"]["thinc"] == thinc.__version__
    log = (spec.directory / "run.log").read_text()
    assert log.count("$ python -m workflow.resumable_train") == 2  # both starts, appended
    assert "Resuming at step 4" in log
    # the same weights as spaCy's own loop
    reference = tmp_path / "spacy"
    keys = (key.removeprefix("--") for key in overrides[::2])
    spacy_train(config, reference, overrides=dict(zip(keys, overrides[1::2])))
    assert model_files(spec.directory) == model_files(reference)


def _resident_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(
    __import__("platform").libc_ver()[0] != "glibc" or not Path("/proc/self/status").exists(),
    reason="malloc_trim is glibc's; the resident set is read from /proc",
)
def test_release_freed_memory_returns_freed_heap_blocks_to_the_os():
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    # 200 MB in 4 KB blocks (below the mmap threshold: from the heap), touched so they are
    # resident; every block but the last is freed, which pins the top of the heap
    blocks = [libc.malloc(4096) for _ in range(50_000)]
    for block in blocks:
        libc.memset(block, 1, 4096)
    for block in blocks[:-1]:
        libc.free(block)
    before = _resident_kb()
    assert resumable_train.release_freed_memory() is True
    after = _resident_kb()
    libc.free(blocks[-1])
    assert before - after > 100_000, (before, after)
