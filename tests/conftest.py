"""Shared test fixtures: the AllenNLP/bilm-tf tiny ELMo and random models in its layout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_FIXTURE = REPO.parent / "shared" / "fixtures" / "allennlp_elmo"
CACHE = Path(os.environ.get("SPACY_ELMO_TEST_CACHE", Path.home() / ".cache" / "spacy-elmo-tests"))
FIXTURE_FILES = (
    "options.json",
    "lm_weights.hdf5",
    "sentences.json",
    "lm_embeddings_0.hdf5",
    "lm_embeddings_1.hdf5",
    "lm_embeddings_2.hdf5",
    "vocab_test.txt",
    "elmo_token_embeddings.hdf5",
)


def _fetch_from_allennlp_wheel() -> Path:
    """Unpack the same fixture from the allennlp==0.9.0 wheel on PyPI into a cache."""
    target = CACHE / "allennlp_elmo"
    if all((target / name).exists() for name in FIXTURE_FILES):
        return target
    wheels = CACHE / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "allennlp==0.9.0",
            "-d",
            str(wheels),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(wheels.glob("allennlp-0.9.0-*.whl"))
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for name in FIXTURE_FILES:
            (target / name).write_bytes(archive.read(f"allennlp/tests/fixtures/elmo/{name}"))
    return target


@pytest.fixture(scope="session")
def allennlp_fixture() -> Path:
    """Directory holding the AllenNLP ELMo test fixture (shared copy, else the PyPI wheel)."""
    if all((SHARED_FIXTURE / name).exists() for name in FIXTURE_FILES):
        return SHARED_FIXTURE
    try:
        return _fetch_from_allennlp_wheel()
    except (subprocess.CalledProcessError, StopIteration, OSError, KeyError) as err:
        pytest.skip(f"AllenNLP ELMo fixture not available: {err}")


@pytest.fixture(scope="session")
def bilm_dir(tmp_path_factory) -> Path:
    """A saved tiny biLM (random weights) for the spaCy integration tests."""
    from .pipeline.pipeline_util import save_tiny_bilm

    directory = tmp_path_factory.mktemp("bilm")
    save_tiny_bilm(directory)
    return directory
