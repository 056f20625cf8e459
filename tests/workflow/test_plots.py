"""The plots of the pipelines: one colour per pipeline everywhere, the learning curves on a log
axis at the true sentence counts, a single run drawn as one; the pretraining plot's title."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy
import pytest
from matplotlib import image as mpimage
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from benchmarks import bench_pipeline
from spacy_elmo.pretrain.plot import plot_metrics
from workflow.bundle_model import retitle_plot
from workflow.evidence import report
from workflow.evidence.colours import PIPELINE_COLOURS, pipeline_colour
from workflow.evidence.runs import PIPELINES

matplotlib.use("Agg")


@pytest.fixture
def saved_figures(monkeypatch) -> list:
    """The figures the code saves, kept open for inspection."""
    from matplotlib import pyplot
    from matplotlib.figure import Figure

    figures = []
    original = Figure.savefig

    def savefig(figure, *args, **kwargs):
        figures.append(figure)
        return original(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    monkeypatch.setattr(pyplot, "close", lambda *args: None)
    return figures


def _run(pipeline: str, n: int, seed: int, f1: float, **extra) -> dict:
    size = "all" if n == 14041 else str(n)
    return {"pipeline": pipeline, "size": size, "train_sentences": n, "seed": seed,
            "test": {"ents_f": f1, "tag_acc": 0.9}, "dev": {"ents_f": f1, "tag_acc": 0.9},
            **extra}  # fmt: skip


def test_every_pipeline_has_one_colour_in_every_plot():
    assert set(PIPELINE_COLOURS) == set(PIPELINES) == set(bench_pipeline.PIPELINES)
    assert len(set(PIPELINE_COLOURS.values())) == len(PIPELINE_COLOURS)
    assert bench_pipeline.PIPELINE_COLOURS is PIPELINE_COLOURS
    assert pipeline_colour("transformer (2x steps)") == PIPELINE_COLOURS["transformer"]
    with pytest.raises(ValueError, match="no colour for pipeline 'bert'"):
        pipeline_colour("bert")


def test_learning_curves_use_true_counts_colours_and_show_single_runs(tmp_path, saved_figures):
    runs = [
        _run(p, n, s, 0.6 + 0.01 * s + n / 1e5)
        for p in ("baseline", "elmo")
        for n in (1000, 3000, 14041)
        for s in (0, 1, 2)
    ]
    runs.append(_run("transformer", 1000, 0, 0.7))  # one run
    runs += [_run("transformer", 3000, s, 0.75 + 0.01 * s) for s in (0, 1)]
    report.plot_curves(runs, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    (figure,) = saved_figures
    (axes,) = figure.axes
    assert axes.get_xscale() == "log"
    assert list(axes.get_xticks()) == [1000, 3000, 14041]
    lines = {line.get_label(): line for line in axes.get_lines()}
    for pipeline in ("baseline", "elmo", "transformer"):
        assert to_hex(lines[pipeline].get_color()) == PIPELINE_COLOURS[pipeline]
        assert list(lines[pipeline].get_xdata()) == [
            n for n in (1000, 3000, 14041) if pipeline != "transformer" or n < 14041
        ]
    bars = [c for c in axes.containers if isinstance(c, ErrorbarContainer)]
    # an error bar for each mean of several runs (3 + 3 + 1), none for the single run
    assert len(bars) == 7
    xs = sorted(float(bar.lines[0].get_xdata()[0]) for bar in bars)
    assert xs.count(1000) == 2 and xs.count(3000) == 3
    hollow = [line for line in axes.get_lines() if line.get_markerfacecolor() == "white"]
    assert [(list(h.get_xdata()), to_hex(h.get_markeredgecolor())) for h in hollow] == [
        ([1000], PIPELINE_COLOURS["transformer"])
    ]
    assert "a single run (no spread)" in [t.get_text() for t in axes.get_legend().get_texts()]


def test_the_pretraining_plot_says_which_stage_it_shows(tmp_path, saved_figures):
    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": s, "tokens": 1000 * s, "train_ppl": 500.0 / s} for s in range(1, 5)]
    records.append({"step": 4, "dev_ppl": 150.0, "dev_ppl_forward": 140.0,
                    "dev_ppl_backward": 160.0})  # fmt: skip
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_metrics(metrics, tmp_path / "a.png", title="Bundled biLM, pretraining stage 3 of 3")
    plot_metrics(metrics, tmp_path / "b.png")
    titles = [figure.axes[0].get_title() for figure in saved_figures]
    assert titles == ["Bundled biLM, pretraining stage 3 of 3", "biLM pretraining"]
    assert Path(tmp_path / "a.png").stat().st_size > 0


def test_a_kept_plot_gets_a_new_title_and_keeps_every_pixel_of_the_plot(tmp_path, saved_figures):
    metrics = tmp_path / "metrics.jsonl"
    records = [{"step": s, "tokens": 1000 * s, "train_ppl": 500.0 / s} for s in range(1, 5)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_metrics(metrics, tmp_path / "run.png")
    retitle_plot(tmp_path / "run.png", tmp_path / "titled.png", "pretraining stage 3 of 3")
    assert [t.get_text() for t in saved_figures[-1].texts] == ["pretraining stage 3 of 3"]
    before, after = mpimage.imread(tmp_path / "run.png"), mpimage.imread(tmp_path / "titled.png")
    assert before.shape == after.shape
    dark_rows = numpy.flatnonzero((before[..., :3].mean(axis=2) < 0.5).mean(axis=1) > 0.5)
    frame_top = int(dark_rows[0])
    assert 0 < frame_top < before.shape[0] // 4  # the frame's top edge, under the title band
    numpy.testing.assert_array_equal(before[frame_top:], after[frame_top:])
    assert not numpy.array_equal(before[:frame_top], after[:frame_top])


def test_an_image_without_a_plot_frame_is_refused(tmp_path):
    mpimage.imsave(tmp_path / "blank.png", numpy.ones((40, 60, 3)))
    with pytest.raises(ValueError, match="no plot frame found"):
        retitle_plot(tmp_path / "blank.png", tmp_path / "out.png", "a title")
