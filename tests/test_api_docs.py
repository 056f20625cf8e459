"""docs/API.md is what scripts/api_docs.py writes from the code (regenerate it when it differs)."""

from __future__ import annotations

from pathlib import Path

from .scripts.script_loader import load_script

REPO = Path(__file__).resolve().parent.parent


def test_api_reference_is_up_to_date():
    api_docs = load_script("api_docs")
    expected = api_docs.render()
    assert (REPO / "docs" / "API.md").read_text(encoding="utf-8") == expected, (
        "docs/API.md is out of date: run `python scripts/api_docs.py`"
    )
    for name in ("elmo", "spacy_elmo.ElmoModel.v1", "spacy_elmo.AllenNLPWeights.v1"):
        assert f"### `{name}`" in expected
    assert "| `layer_dropout` |" in expected and "| `cell_clip` |" in expected
    # A function registered under two names is described once, the other name an alias.
    assert expected.count("Mix the biLM layers of every doc") == 1
    assert "`spacy_elmo.layers.scalar_mix:scalar_mix`: an alias" in expected
    assert "`doc._.elmo_mix_coefficients`: c = gamma * s" in expected
