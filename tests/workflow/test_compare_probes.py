"""compare_probes.py: the README table of two probe results written in the test."""

from __future__ import annotations

import json
import sys

from workflow import compare_probes as cp


def probe_result(shift: float) -> dict:
    wsd_part = {"layers": [0.25, 0.5, 0.5], "baseline_most_frequent_sense": 0.375, "n_test": 8}
    return {
        "pos": {
            "wsj": {
                "layers": [0.5 + shift, 0.875, 0.75],
                "baseline_most_frequent_tag": 0.625,
                "n_test_tokens": 40,
            },
            "brown": {
                "layers": [0.5, 0.75, 0.875 + shift],
                "baseline_most_frequent_tag": 0.5,
                "n_test_tokens": 30,
            },
        },
        "wsd": {
            "layers": [0.125, 0.25 + shift, 0.25],
            "baseline_most_frequent_sense": 0.5,
            "n_test": 16,
            "by_pos": {"adv": wsd_part},
        },
    }


def test_table_of_two_models(tmp_path, monkeypatch, capsys):
    for name, shift in (("a", 0.0), ("b", 0.0625)):
        (tmp_path / f"{name}.json").write_text(json.dumps(probe_result(shift)))
    argv = ["compare_probes.py", f"A={tmp_path / 'a.json'}", f"B={tmp_path / 'b.json'}"]
    monkeypatch.setattr(sys, "argv", argv)
    cp.main()
    assert capsys.readouterr().out.splitlines() == [
        "| probe | baseline | A: layer 0 | layer 1 | layer 2 | B: layer 0 | layer 1 | layer 2 "
        "| paper: layer 1 | layer 2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| POS, WSJ | 62.5 | 50.0 | **87.5** | 75.0 | 56.2 | **87.5** | 75.0 | 97.3 | 96.8 |",
        "| POS, Brown | 50.0 | 50.0 | 75.0 | **87.5** | 50.0 | 75.0 | **93.8** | | |",
        "| WSD, WordNet examples | 50.0 | 12.5 | **25.0** | **25.0** | 12.5 | **31.2** | 25.0 "
        "| 67.4 | 69.0 |",
        "| WSD, adverbs only | 37.5 | 25.0 | **50.0** | **50.0** | 25.0 | **50.0** | **50.0** "
        "| | |",
    ]
