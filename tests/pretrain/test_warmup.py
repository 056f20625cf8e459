"""A warm-up longer than the run is named at the start of pretraining."""

from __future__ import annotations

import json

import pytest

from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain.config import warmup_longer_than_run

from .test_pretrain import tiny_config, write_corpus


def test_a_warmup_longer_than_max_steps_warns_naming_both(tmp_path, caplog):
    corpus = write_corpus(tmp_path / "corpus.txt", n=100)
    config = tiny_config(tmp_path, corpus, max_steps=3, warmup_steps=300, log_every=1)
    with caplog.at_level("WARNING", logger="spacy_elmo.pretrain"):
        pretrain(config)
    (message,) = [r.getMessage() for r in caplog.records if "warmup_steps" in r.getMessage()]
    assert "warmup_steps=300 is longer than max_steps=3" in message and "--" not in message
    assert "1/300 of its peak (learning_rate=0.01)" in message and "1.00% of it" in message
    # what it warns of: the rate of the last step is a small part of the peak
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    last_lr = [r["lr"] for r in records if "lr" in r][-1]
    assert last_lr == pytest.approx(0.01 * 4 / 300)  # the rate after 3 steps: (3 + 1) / 300


@pytest.mark.parametrize("warmup, steps", [(0, 1), (5, 30), (30, 30)])
def test_a_warmup_within_the_run_is_not_named(tmp_path, warmup, steps):
    config = tiny_config(tmp_path, tmp_path / "c.txt", warmup_steps=warmup, max_steps=steps)
    assert warmup_longer_than_run(config) is None
