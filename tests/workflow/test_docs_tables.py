"""The generated sections of the docs pages are what the workflow commands write today (rerun
the command named in the failure when one differs), and --page rewrites only its section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflow import compare_probes, report_bundled
from workflow.evidence import report
from workflow.markers import markers, replace_between_markers

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def section(page: Path, name: str) -> str:
    start, end = markers(name)
    text = page.read_text(encoding="utf-8")
    assert text.count(start) == 1 and text.count(end) == 1, f"{page}: {start} ... {end}"
    return text[text.index(start) + len(start) : text.index(end)].strip("\n")


def test_learning_curves_page_holds_the_evidence_report():
    data = json.loads((REPO / "results" / "evidence.json").read_text())
    expected = report.render_markdown(data["runs"], data["bilm"], "evidence.png")
    assert section(DOCS / "learning-curves.md", report.MARKER) == expected.strip("\n"), (
        "run `spacy project run evidence-report`"
    )


def test_readme_holds_the_evidence_headline():
    data = json.loads((REPO / "results" / "evidence.json").read_text())
    assert section(REPO / "README.md", report.HEADLINE_MARKER) == report.headline(data["runs"]), (
        "run `spacy project run evidence-report`"
    )


def test_model_card_holds_the_bundled_card_and_the_probes():
    assert section(DOCS / "model-card.md", report_bundled.MARKER) == report_bundled.card_table(
        report_bundled.BUNDLED_MODEL
    ), "run `python -m workflow.report_bundled --page docs/model-card.md`"
    results = REPO / "results"
    models = [
        (name, compare_probes.rows(json.loads((results / folder / "probe.json").read_text())))
        for name, folder in (
            ("stage 1", "probe_stage1"),
            ("stages 1-2", "probe_stage2"),
            ("bundled (1-3)", "probe"),
        )
    ]
    assert section(DOCS / "model-card.md", compare_probes.MARKER) == (
        compare_probes.comparison_table(models)
    ), "run `python -m workflow.compare_probes ... --page docs/model-card.md`"


def test_page_option_rewrites_only_its_section(tmp_path, capsys):
    page = tmp_path / "card.md"
    page.write_text("# Card\n\n<!-- probes:start -->\nold\n<!-- probes:end -->\n\nprose\n")
    probe = {"pos": {"wsj": {"layers": [0.5, 0.75, 0.625], "baseline_most_frequent_tag": 0.25,
                             "n_test_tokens": 8}}}  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(probe))
    compare_probes.main([f"m={tmp_path / 'p.json'}", "--page", str(page)])
    table = capsys.readouterr().out.split("\nupdated the probes section")[0]
    assert page.read_text() == (
        f"# Card\n\n<!-- probes:start -->\n{table}\n<!-- probes:end -->\n\nprose\n"
    )
    assert "| POS, WSJ | 25.0 | 50.0 | **75.0** | 62.5 | 97.3 | 96.8 |" in table
    with pytest.warns(UserWarning, match="no <!-- other:start -->"):
        assert not replace_between_markers(page, "other", "x")
