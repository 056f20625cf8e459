"""One colour per pipeline, the same in every plot of the pipelines: the learning curves
(`report.plot_curves`) and accuracy against speed (benchmarks/bench_pipeline.py)."""

from __future__ import annotations

PIPELINE_COLOURS = {
    "baseline": "#7f7f7f",
    "vectors": "#1f77b4",
    "elmo": "#d62728",
    "vectors+elmo": "#9467bd",
    "transformer": "#2ca02c",
}


def pipeline_colour(row: str) -> str:
    """The colour of a table row: its pipeline's, whatever its step budget
    ("transformer (2x steps)" is the transformer's colour)."""
    pipeline = row.split(" (")[0]
    if pipeline not in PIPELINE_COLOURS:
        raise ValueError(
            f"no colour for pipeline {pipeline!r} (row {row!r}); add it to PIPELINE_COLOURS in "
            "workflow/evidence/colours.py"
        )
    return PIPELINE_COLOURS[pipeline]
