"""Corpus scale: embed or annotate many files across processes, machines and GPUs on Ray.

plan.py finds and checks the inputs and cuts big files into line ranges; manifest.py records
what is finished; lock.py keeps one run per output folder; engine.py runs the shards on Ray
actors (one model load per worker); embed.py and apply.py are the two jobs.
"""

from .apply import apply_corpus
from .embed import embed_corpus
from .engine import Cluster, RunStats

__all__ = ["Cluster", "RunStats", "apply_corpus", "embed_corpus"]
