"""A corpus run without Ray: the driver (runner.py) as it is, its shards run here, in order."""

from __future__ import annotations

import time

import pytest

from spacy_elmo.corpus import runner
from spacy_elmo.corpus.engine import RunStats


def run_inline(job, tasks, cluster, on_done, progress=True, description="shards"):
    """`engine.run_tasks` in this process: one worker, the job's state set up once, each task
    (and the joins that `on_done` returns) run in turn; a task that raises is a failure."""
    stats = RunStats(workers={"inline"})
    state = job.setup()
    queue = list(tasks)
    start = time.perf_counter()
    while queue:
        task = queue.pop(0)
        try:
            result = job.run(state, task.payload)
        except Exception as error:  # noqa: BLE001 - reported as the engine reports it
            stats.failures.append((task.name, str(error)))
            continue
        stats.lines += task.lines
        queue[:0] = on_done(task, result)
    stats.run_seconds = time.perf_counter() - start
    return stats


@pytest.fixture
def inline(monkeypatch):
    """Corpus runs in this test run their shards in this process (no Ray)."""
    monkeypatch.setattr(runner, "run_tasks", run_inline)
    return run_inline
