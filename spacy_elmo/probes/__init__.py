"""Layer probes of Peters et al. (2018), section 5.3, on a frozen biLM (`spacy-elmo probe`):
per layer, a linear POS tagger and 1-nearest-neighbour word sense disambiguation, each next to
its context-free baseline, on data read from an asset folder (`data.PROBE_DATA`).
"""

from .data import PROBE_DATA, TASKS, check_assets, parse_tasks
from .report import write_report
from .tasks import run_probes

__all__ = ["PROBE_DATA", "TASKS", "check_assets", "parse_tasks", "run_probes", "write_report"]
