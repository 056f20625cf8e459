"""The options and report that `embed-corpus` and `apply` share (where they run, what they did)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


class corpus_options:
    """Declarations of --workers, --address, --threads-per-worker and --gpus-per-worker."""

    @staticmethod
    def workers() -> Any:
        return typer.Option(
            None,
            "--workers",
            min=1,
            help="Worker processes, each with its own model (default: CPUs / threads per "
            "worker). Without --address: starts a local Ray instance on 127.0.0.1 for this run.",
        )

    @staticmethod
    def address() -> Any:
        return typer.Option(
            None,
            "--address",
            envvar="RAY_ADDRESS",
            help="Join a running Ray cluster (HOST:PORT of its head) instead of starting one.",
        )

    @staticmethod
    def threads_per_worker() -> Any:
        return typer.Option(
            None, "--threads-per-worker", min=1, help="torch threads per worker (CPUs / workers)."
        )

    @staticmethod
    def gpus_per_worker() -> Any:
        return typer.Option(
            0.0, "--gpus-per-worker", min=0.0, help="GPUs of each worker (fractions share one)."
        )


def cluster_from_options(
    workers: Optional[int],
    address: Optional[str],
    threads_per_worker: Optional[int],
    gpus_per_worker: float,
):
    from ..corpus.engine import Cluster

    return Cluster(workers, address, threads_per_worker, gpus_per_worker)


def report(result, output_dir: Path, unit: str = "sentences") -> None:
    """One line: what was written and skipped, and how fast (`unit`: what the inputs' lines
    are, sentences for embed-corpus, documents for apply)."""
    from ..corpus.plan import printable

    output_dir = printable(output_dir)  # a name that is not UTF-8: its bytes as \xNN
    stats = result.stats
    if stats is None:
        typer.echo(f"nothing to do: {len(result.skipped)} outputs in {output_dir} are up to date")
        return
    rate = stats.lines / stats.run_seconds if stats.run_seconds > 0 else 0.0
    typer.echo(
        f"wrote {len(result.written)} outputs ({stats.lines} {unit}, {rate:.1f}/s on "
        f"{len(stats.workers)} workers, Ray start-up {stats.startup_seconds:.1f} s) to "
        f"{output_dir}; {len(result.skipped)} up to date"
    )
