"""Corpus scale: embed or annotate many files across processes, machines and GPUs on Ray.

plan.py checks the inputs and cuts them into shards; runner.py drives a run and keeps the output
folder's own files (lock, manifest, parts, temporary files); engine.py runs the shards on Ray
actors (reaper.py ends what they leave); embed.py and apply.py are the two jobs.
"""

from .apply import apply_corpus
from .embed import embed_corpus
from .engine import Cluster, RunStats

__all__ = ["Cluster", "RunStats", "apply_corpus", "embed_corpus"]
