"""The figures that the README and usage.md quote from results/readme/ are what the bundled
biLM computes now (the cosines, recomputed with NumPy on its layers), and what the record holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workflow.readme_figures import bank_similarities, cosine

REPO = Path(__file__).resolve().parents[2]


def test_cosine_is_numpy_on_two_vectors():
    a, b = np.array([1.0, 0.0], np.float32), np.array([1.0, 1.0], np.float32)
    assert cosine(a, b) == np.float32(1 / np.sqrt(2))


def test_the_quoted_figures_are_the_record_and_the_biLM_now():
    record = json.loads((REPO / "results" / "readme" / "figures.json").read_text())
    now = bank_similarities()
    for name, value in now.items():
        assert abs(record[name] - value) < 1e-4, (name, record[name], value)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    usage = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    assert f"# {now['quick_start_1_bank_cosine']:.3f} (results/readme/)" in readme
    assert f"It took {record['quick_start_2_seconds']:.0f} s on two CPU cores" in readme
    same, other = now["sense_check_same_sense_mean"], now["sense_check_other_sense_mean"]
    assert f"(top layer {same:.4f} against\n  {other:.4f}," in usage
