"""GPU path (skipped without CUDA and cupy): biLM on CUDA, mixes on cupy, no host round trip.

Run with `pytest -m gpu` (benchmarks/gpu_check.sh does it on a GPU machine).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
cupy = pytest.importorskip("cupy")

import spacy  # noqa: E402
from spacy.training import Example  # noqa: E402
from spacy.util import load_model_from_config  # noqa: E402

from spacy_elmo import BiLM  # noqa: E402
from spacy_elmo.layers.elmo_model import get_bilm  # noqa: E402

from .pipeline.pipeline_util import (  # noqa: E402
    save_tiny_bilm,
    synthetic_docs,
    tiny_nlp,
    tiny_training_config,
    write_train_dev,
)


@pytest.fixture(autouse=True)
def exact_fp32():
    torch.backends.cudnn.allow_tf32 = False  # TF32 convolutions are not float32-exact
    torch.backends.cuda.matmul.allow_tf32 = False


def test_fixture_reproduces_on_cuda(allennlp_fixture):
    bilm = BiLM.from_allennlp(
        allennlp_fixture / "options.json", allennlp_fixture / "lm_weights.hdf5", stateful=True
    ).cuda()
    with open(allennlp_fixture / "sentences.json") as f:
        sentences = [[s.split() for s in group] for group in json.load(f)]
    import h5py

    for i in range(10):
        outputs = bilm.embed([sentences[k][i] for k in range(3)], batch_size=3)
        for k in range(3):
            with h5py.File(allennlp_fixture / f"lm_embeddings_{k}.hdf5") as f:
                expected = np.concatenate(f[str(i)][...], axis=-1)
            np.testing.assert_allclose(outputs[k][2], expected, atol=1e-5, rtol=0)


def test_pipeline_runs_on_gpu_and_matches_cpu(tmp_path):
    save_tiny_bilm(tmp_path / "bilm")
    cpu = tiny_nlp(tmp_path / "bilm")
    cpu.initialize()
    expected = cpu("The river bank overflowed")._.elmo_layers
    spacy.require_gpu()
    try:
        nlp = tiny_nlp(tmp_path / "bilm")
        nlp.initialize()
        assert next(get_bilm(nlp.get_pipe("elmo").model).parameters()).is_cuda
        doc = nlp("The river bank overflowed")
        assert isinstance(doc._.elmo_layers, cupy.ndarray)
        np.testing.assert_allclose(doc._.elmo_layers.get(), expected, atol=1e-5)
        assert isinstance(doc._.elmo, cupy.ndarray)
        restored = spacy.tokens.Doc(nlp.vocab).from_bytes(doc.to_bytes())
        np.testing.assert_allclose(np.asarray(restored._.elmo_layers), expected, atol=1e-5)
    finally:
        spacy.require_cpu()


def test_training_on_gpu_keeps_mixes_on_cupy(tmp_path):
    save_tiny_bilm(tmp_path / "bilm")
    data = write_train_dev(tmp_path, 20, 5)
    spacy.require_gpu()
    try:
        nlp = load_model_from_config(tiny_training_config(tmp_path / "bilm", *data), auto_fill=True)
        gold = synthetic_docs(nlp, 10, seed=2)
        examples = [
            Example(spacy.tokens.Doc(nlp.vocab, words=[t.text for t in d]), d) for d in gold
        ]
        nlp.initialize(lambda: examples)
        optimizer = nlp.create_optimizer()
        for _ in range(3):
            losses = nlp.update(examples, sgd=optimizer)
        assert losses["tagger"] > 0
        for name in ("tagger", "ner"):
            mixes = [n for n in nlp.get_pipe(name).model.walk() if n.name == "scalar_mix"]
            assert isinstance(mixes[0].get_param("weights"), cupy.ndarray)
    finally:
        spacy.require_cpu()
