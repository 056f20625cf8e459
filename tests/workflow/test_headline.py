"""workflow/headline.py: the README's headline table is what the script computes from
results/evidence.json, its cells are means, standard deviations and Welch intervals computed
independently here, and the headline sentences of the docs pages state the same differences."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from workflow import headline
from workflow.evidence import report

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# Student's t, 97.5% quantile, 4 degrees of freedom (any printed table)
T_975_DF4 = 2.7764451


def readme_table() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start, end = (f"<!-- {report.HEADLINE_MARKER}:{side} -->" for side in ("start", "end"))
    assert text.count(start) == 1 and text.count(end) == 1
    return text[text.index(start) + len(start) : text.index(end)].strip("\n")


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return headline.load_runs(REPO / "results" / "evidence.json")


@pytest.fixture(scope="module")
def found(runs):
    """difference(better, reference, size) in points, from the kept runs."""
    table = headline.cells(runs)

    def get(better: str, reference: str, size: int) -> tuple[float, tuple[float, float] | None]:
        result = headline.difference(table, better, reference, size)
        assert result is not None, (better, reference, size)
        return result

    return get


def test_readme_holds_the_table_the_script_prints(runs, capsys):
    assert readme_table() == headline.render(runs), (
        "run `python -m workflow.headline --readme README.md`"
    )
    assert headline.main(["--evidence", str(REPO / "results" / "evidence.json")]) == 0
    assert capsys.readouterr().out.strip("\n") == readme_table()
    # the evidence report writes the same table into the README
    assert report.headline(runs) == readme_table()


def test_readme_table_is_short_and_names_the_five_pipelines():
    rows = [line for line in readme_table().splitlines() if line.startswith("| ")][1:]
    assert len(rows) <= 12
    names = [row.split(" | ")[0][2:] for row in rows]
    assert names[:5] == list(headline.PIPELINES)
    assert "*elmo − baseline*" in names and "*vectors+elmo − vectors*" in names


def _run(pipeline: str, size: int, seed: int, f1: float, steps: int | None = None) -> dict:
    label = "all" if size == 14041 else str(size)
    standard = {1000: 1000, 3000: 1600, 14041: 4000}[size]
    return {
        "pipeline": pipeline, "size": label, "train_sentences": size, "seed": seed,
        "test": {"ents_f": f1, "tag_acc": 0.9}, "dev": {"ents_f": f1, "tag_acc": 0.9},
        "max_steps": steps or standard,
    }  # fmt: skip


def test_cells_and_intervals_against_an_independent_computation():
    elmo = [0.70, 0.72, 0.74]
    baseline = [0.66, 0.68, 0.70]  # the same spread: Welch's df is exactly 2n - 2 = 4
    vectors = [0.75]
    runs = [_run("elmo", 1000, s, f) for s, f in enumerate(elmo)]
    runs += [_run("baseline", 1000, s, f) for s, f in enumerate(baseline)]
    runs += [_run("vectors", 1000, s, f) for s, f in enumerate(vectors)]
    runs += [_run("baseline", 3000, 0, 0.74)]
    text = headline.render(runs)
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}

    mean, std = 100 * np.mean(elmo), 100 * np.std(elmo, ddof=1)
    assert rows["elmo"] == f"| elmo | {mean:.2f} ± {std:.2f} (3) | – |"
    assert rows["vectors"] == "| vectors | 75.00 (1) | – |"
    difference = 100 * (np.mean(elmo) - np.mean(baseline))
    half = T_975_DF4 * math.sqrt(2 * np.var(elmo, ddof=1) / 3) * 100
    assert rows["*elmo − baseline*"] == (
        f"| *elmo − baseline* | {difference:+.2f} [{difference - half:+.2f}, "
        f"{difference + half:+.2f}] | – |"
    )
    # one run on a side: the difference without an interval
    expected = 100 * (vectors[0] - np.mean(baseline))
    assert rows["*vectors − baseline*"] == f"| *vectors − baseline* | {expected:+.2f} | – |"
    # no transformer or vectors+elmo runs: no rows for them or their differences
    assert "transformer" not in text and "vectors+elmo" not in text
    assert text.startswith("**NER F1**")


def test_twice_the_steps_is_its_own_row(tmp_path):
    runs = [_run("transformer", 1000, s, 0.78 + s / 100, steps=2000) for s in range(2)]
    runs += [_run("vectors+elmo", 1000, s, 0.76 + s / 100, steps=2000) for s in range(2)]
    runs += [_run("transformer", 1000, s, 0.70 + s / 100) for s in range(2)]
    text = headline.render(runs)
    row = next(line for line in text.splitlines() if "both at 2x steps" in line)
    assert row.startswith("| *transformer − vectors+elmo, both at 2x steps* | +2.00 [")
    # the transformer's standard-budget row holds only its standard-budget runs
    assert "| transformer | 70.50 ± 0.71 (2) |" in text
    evidence = tmp_path / "evidence.json"
    evidence.write_text(json.dumps({"runs": runs}))
    readme = tmp_path / "README.md"
    readme.write_text(
        "# R\n<!-- evidence-headline:start -->\nold\n<!-- evidence-headline:end -->\n"
    )
    assert headline.main(["--evidence", str(evidence), "--readme", str(readme)]) == 0
    assert readme.read_text() == (
        f"# R\n<!-- evidence-headline:start -->\n{text}\n<!-- evidence-headline:end -->\n"
    )
    with pytest.raises(FileNotFoundError, match="no evidence report"):
        headline.load_runs(tmp_path / "missing.json")


def test_learning_curves_sentences_state_the_recomputed_differences(found):
    text = " ".join((DOCS / "learning-curves.md").read_text(encoding="utf-8").split())
    elmo = {n: found("elmo", "baseline", n) for n in (1000, 3000, 14041)}
    assert f"ELMo adds **{elmo[1000][0]:+.2f} F1**" in text
    assert f"With 3,000 sentences: {elmo[3000][0]:+.2f} F1" in text
    low, high = elmo[14041][1]
    assert f"**{elmo[14041][0]:+.2f} F1 over 10 seeds**" in text
    assert f"[{low:+.2f}, {high:+.2f}]" in text
    vectors = [found("vectors", "baseline", n)[0] for n in (1000, 3000, 14041)]
    assert "{:+.2f}, {:+.2f} and {:+.2f} F1 over the baseline".format(*vectors) in text
    both = [found("vectors+elmo", "vectors", n)[0] for n in (1000, 3000, 14041)]
    assert "ELMo adds {:+.2f} F1 (1,000), {:+.2f} (3,000) and {:+.2f} (all)".format(*both) in text
    transformer = [found("transformer", "vectors+elmo", n)[0] for n in (1000, 3000, 14041)]
    sentence = "at 1,000 sentences ({:+.2f}) and ahead at 3,000 ({:+.2f}) and with all sentences"
    assert (sentence + " ({:+.2f})").format(*transformer) in text
    double, interval = found("transformer (2x steps)", "vectors+elmo (2x steps)", 1000)
    assert f"{double:+.2f} NER F1 over vectors+elmo at the same budget" in text
    assert f"[{interval[0]:+.2f}, {interval[1]:+.2f}]" in text


def test_transformer_page_states_the_recomputed_differences(found):
    text = " ".join((DOCS / "research" / "transformer.md").read_text(encoding="utf-8").split())
    double = " (2x steps)"
    harness = [found("transformer", "vectors+elmo", n)[0] for n in (1000, 3000)]
    assert "against {:+.2f} and {:+.2f} at the harness budget".format(*harness) in text
    elmo = [found("elmo" + double, "baseline" + double, n)[0] for n in (1000, 3000)]
    assert "elmo − baseline {:+.2f} and {:+.2f}".format(*elmo) in text
    both = [found("vectors+elmo" + double, "vectors" + double, n)[0] for n in (1000, 3000)]
    assert "vectors+elmo − vectors {:+.2f} and {:+.2f} at twice the steps".format(*both) in text


def test_choosing_sentences_state_the_recomputed_differences(found):
    text = " ".join((DOCS / "choosing.md").read_text(encoding="utf-8").split())
    vectors = {n: found("vectors", "baseline", n)[0] for n in (1000, 14041)}
    assert (
        f"{vectors[1000]:+.1f} NER F1 at 1,000 training sentences and "
        f"{vectors[14041]:+.1f} with all 14,041 (means over all seeds"
    ) in text
    both = {n: found("vectors+elmo", "vectors", n)[0] for n in (1000, 3000, 14041)}
    assert (
        f"adds {both[1000]:+.1f} NER F1 at 1,000 sentences and {both[3000]:+.1f} at 3,000" in text
    )
    assert f"the data, {both[14041]:+.1f} F1" in text
