"""Layer probes of Peters et al. (2018), section 5.3, on a frozen biLM (`spacy-elmo probe`).

Per biLM layer: (a) a linear softmax POS tagger trained on the frozen token vectors, next to
the most-frequent-tag baseline, and (b) 1-nearest-neighbour word sense disambiguation over
sense centroids (Melamud et al. 2016), next to the most-frequent-sense baseline (`tasks`). The
data (a tagged WSJ sample, the Brown corpus, WordNet 3.0) are read from an asset folder
(`data.PROBE_DATA` says where each lies and which package holds it; `wordnet` reads WordNet with
its own morphology); `report` writes probe.json, probe.md and probe.png.
"""

from .data import PROBE_DATA, TASKS, asset_path, check_assets, missing_files
from .report import PAPER, PLURALS, markdown_report, report_rows, write_report
from .runner import ProbeSettings, parse_tasks, run_probes

__all__ = [
    "PAPER",
    "PLURALS",
    "PROBE_DATA",
    "TASKS",
    "ProbeSettings",
    "asset_path",
    "check_assets",
    "markdown_report",
    "missing_files",
    "parse_tasks",
    "report_rows",
    "run_probes",
    "write_report",
]
