"""`spacy package` builds a package that installs and loads with nothing but itself."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from .pipeline_util import save_tiny_bilm, tiny_nlp


def test_spacy_package_installs_and_loads(tmp_path):
    save_tiny_bilm(tmp_path / "bilm")
    nlp = tiny_nlp(tmp_path / "bilm")
    nlp.initialize()
    nlp.to_disk(tmp_path / "pipeline")
    (tmp_path / "dist").mkdir()
    run = dict(capture_output=True, text=True, timeout=300)
    result = subprocess.run(
        [sys.executable, "-m", "spacy", "package", str(tmp_path / "pipeline"),
         str(tmp_path / "dist"), "--name", "tiny_elmo", "--version", "0.0.1", "--build", "sdist"],
        **run,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (sdist,) = (tmp_path / "dist").glob("*/dist/en_tiny_elmo-0.0.1.tar.gz")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
         "--target", str(tmp_path / "site"), str(sdist)],
        **run,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "bilm" / "model.safetensors").unlink()  # the package must not need it
    code = (
        "import spacy, sys, json; nlp = spacy.load('en_tiny_elmo'); "
        "print(json.dumps(nlp('the river bank')._.elmo_layers.tolist()))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = subprocess.run([sys.executable, "-c", code], env=env, **run)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = np.array(__import__("json").loads(result.stdout.strip().splitlines()[-1]))
    expected = nlp("the river bank")._.elmo_layers
    np.testing.assert_allclose(loaded, expected, atol=1e-5)
