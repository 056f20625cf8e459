"""Corpus scale: embed or annotate many files across processes, machines and GPUs on Ray.

plan.py checks the inputs and cuts them into shards; runner.py drives a run (lock, manifest.py,
temporary.py); engine.py runs the shards on Ray actors; embed.py and apply.py are the two jobs.
"""

from .apply import apply_corpus
from .embed import embed_corpus
from .engine import Cluster, RunStats

__all__ = ["Cluster", "RunStats", "apply_corpus", "embed_corpus"]
