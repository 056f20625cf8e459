"""Fixtures of the pretraining tests."""

from __future__ import annotations

import pytest

from spacy_elmo.pretrain import pretrain

from .test_pretrain import short_config, write_corpus


@pytest.fixture
def finished_run(tmp_path):
    """A finished 4-step run in tmp_path/run, with its checkpoint."""
    corpus = write_corpus(tmp_path / "corpus.txt")
    config = short_config(tmp_path, corpus)
    pretrain(config)
    return config, tmp_path / "run"
