"""`--bf16` of `spacy-elmo embed` and `embed-corpus`: the vectors of the bfloat16 biLM."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from spacy_elmo import BiLM
from spacy_elmo.bilm.quantize import set_quantize
from spacy_elmo.cli import app
from spacy_elmo.corpus.embed import EmbedJob, embed_corpus
from spacy_elmo.corpus.engine import Cluster

LINES = ["The river bank overflowed .", "Don 't stop !", "A much longer line of words here ."]
MODES = ["bf16"]


def read(path) -> list[np.ndarray]:
    with h5py.File(path, "r") as f:
        return [f[str(i)][()] for i in range(len(LINES))]


@pytest.mark.parametrize("mode", MODES)
def test_embed_writes_the_quantised_vectors(setup, mode):
    tmp_path, options, weights, text = setup
    args = ["embed", text, "--options", options, "--weights", weights, "-q"]
    for name, extra in (("float32.hdf5", []), (f"{mode}.hdf5", [f"--{mode}"])):
        result = CliRunner().invoke(
            app, [str(a) for a in [*args[:2], tmp_path / name, *args[2:]]] + extra
        )
        assert result.exit_code == 0, result.output
    bilm = BiLM.from_allennlp(options, weights)
    float32 = bilm.embed([line.split() for line in LINES])
    quantised = set_quantize(bilm, mode).embed([line.split() for line in LINES])
    for got, want, other in zip(read(tmp_path / f"{mode}.hdf5"), quantised, float32):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert np.abs(got - other).max() > 1e-5  # not the float32 vectors
    for got, want in zip(read(tmp_path / "float32.hdf5"), float32):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_embed_quantised_refuses_a_gpu(setup, mode):
    tmp_path, options, weights, text = setup
    args = ["embed", text, tmp_path / "o.hdf5", "--options", options, "--weights", weights]
    result = CliRunner().invoke(app, [str(a) for a in args] + [f"--{mode}", "--gpu-id", "0"])
    assert result.exit_code != 0
    assert f"--{mode} runs on the CPU only" in str(result.exception) + result.output


@pytest.mark.parametrize("mode", MODES)
def test_embed_corpus_job_runs_the_quantised_biLM(setup, mode):
    tmp_path, options, weights, text = setup
    job = EmbedJob(model=None, options_file=str(options), weights_file=str(weights), **{mode: True})
    state = job.setup()
    assert state[0].quantize == mode
    assert job.options()["quantize"] == mode
    assert "quantize" not in EmbedJob(None, str(options), str(weights)).options()  # as before
    output = tmp_path / "corpus.hdf5"
    done = job.run(state, {"kind": "whole", "input": str(text), "output": str(output)})
    expected = set_quantize(BiLM.from_allennlp(options, weights), mode)
    staged = done["staged"]  # a whole output is left for the driver to record, then install
    for got, want in zip(read(staged), expected.embed([line.split() for line in LINES])):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_embed_corpus_quantised_refuses_gpu_workers(setup, mode):
    tmp_path, options, weights, text = setup
    with pytest.raises(ValueError, match=f"--{mode} runs on the CPU only"):
        embed_corpus(
            text,
            tmp_path / "out",
            options_file=options,
            weights_file=weights,
            cluster=Cluster(gpus_per_worker=1),
            progress=False,
            **{mode: True},
        )
