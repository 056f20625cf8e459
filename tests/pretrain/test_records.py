"""What a run records (`spacy_elmo.pretrain.records`): metrics.jsonl, cut back to the
checkpoint on resume, and "ran_with", the placement of each part of a run."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import torch

from spacy_elmo.pretrain import pretrain
from spacy_elmo.pretrain.records import TrainWindow, ran_with

HERE = {"threads": 1, "gpu_id": -1, "max_memory_gb": None}
THERE = {"threads": 2, "gpu_id": 0, "max_memory_gb": 64.0}


def test_a_half_written_metrics_line_is_dropped_on_resume(finished_run, caplog):
    config, run = finished_run
    metrics = run / "metrics.jsonl"
    with metrics.open("a") as handle:
        handle.write('{"step": 4, "train_pp')
    with caplog.at_level("WARNING", logger="spacy_elmo.pretrain"):
        pretrain(replace(config, max_steps=6), resume=True)
    assert "not a complete metrics record" in caplog.text
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert max(r["step"] for r in records) == 6


def test_ran_with_adds_a_part_where_the_placement_changes():
    assert ran_with(None, 0, HERE) == [{"step": 0, **HERE}]
    first = {"config": {}, "ran_with": [{"step": 0, **HERE}]}
    assert ran_with(first, 4, HERE) == [{"step": 0, **HERE}]  # the same place: one part
    assert ran_with(first, 4, THERE) == [{"step": 0, **HERE}, {"step": 4, **THERE}]
    # a part that ran no step is replaced, not kept
    moved = {"config": {}, "ran_with": [{"step": 0, **HERE}, {"step": 4, **THERE}]}
    assert ran_with(moved, 4, HERE) == [{"step": 0, **HERE}, {"step": 4, **HERE}]


def test_ran_with_of_a_checkpoint_without_a_record_starts_from_its_settings():
    """A checkpoint of an earlier version (or a damaged record): its settings from step 0."""
    for record in (None, "text", [], [{"step": "0"}], [{"step": 0, "threads": [1]}]):
        checkpoint = {"config": {**THERE, "seed": 0}, "ran_with": record}
        assert ran_with(checkpoint, 6, THERE) == [{"step": 0, **THERE}]


def test_a_window_reports_the_perplexity_of_its_steps():
    window = TrainWindow(8)
    window.add(10, torch.tensor([6.0, 3.0, 9.0, 3.0, 1.0, 4.0, 3.0, 6.0]))
    window.add(5, torch.tensor([2.0, 1.0, 3.0, 1.0, 1.0, 4.0, 0.0, 2.0]))
    record = window.record(step=7, epoch=0, tokens=15, lr=0.5, train_seconds=2.0)
    assert math.isclose(record["train_ppl"], math.exp((6 + 9 + 2 + 3) / 8), rel_tol=1e-6)
    assert math.isclose(record["token_cosine"], 2 / 8) and math.isclose(
        record["context_cosine"], 3 / 8
    )
    assert (record["step"], record["tokens"], record["lr"]) == (7, 15, 0.5)
    # the next window starts empty
    assert window.tokens == 0 and not window.sums.any()
    assert "token_cosine" not in TrainWindow(4).record(1, 0, 1, 0.1, 0.0)
